//! The client: creates payouts at a steady rate through its own recording link, every create an
//! operation of the history.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use tokio::time::Instant;

use crate::history::{F, Type, Value};
use crate::proxy::Recorder;

/// The client: `n` payouts over the accounts at a steady rate across `window`; now and then a
/// create is sent again with the same idempotency key (a client that timed out and retries), and
/// one that got no answer is retried with backoff, a bounded number of times.
pub(super) struct ClientPlan {
    /// The run's client (trusting the run's CA alone, on a TLS run); its timeout is the client's
    /// patience for one create.
    pub(super) http: reqwest::Client,
    pub(super) url: String,
    pub(super) credential: String,
    pub(super) accounts: Vec<uuid::Uuid>,
    pub(super) n: u32,
    pub(super) window: Duration,
    pub(super) seed: u64,
}

pub(super) async fn client(plan: ClientPlan, recorder: Arc<Recorder>, created: Arc<AtomicU64>) {
    let ClientPlan {
        http,
        url,
        credential,
        accounts,
        n,
        window,
        seed,
    } = plan;
    let mut rng = StdRng::seed_from_u64(seed ^ 0x00c1_1e47);
    let start = Instant::now();
    let gap = window.mul_f64(0.85) / n.max(1);
    let limit = Arc::new(tokio::sync::Semaphore::new(64));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        tokio::time::sleep_until(start + gap * i).await;
        let account = accounts[rng.random_range(0..accounts.len())];
        let amount: i64 = rng.random_range(100..=5_000);
        let again = rng.random_bool(0.05);
        let key = format!("chaos-{seed}-{i}");
        let (http, url, credential, recorder, created, limit) = (
            http.clone(),
            url.clone(),
            credential.clone(),
            recorder.clone(),
            created.clone(),
            limit.clone(),
        );
        tasks.spawn(async move {
            let Ok(_permit) = limit.acquire_owned().await else {
                return;
            };
            let sends = if again { 2 } else { 1 };
            let mut done = 0;
            let mut tries = 0u32;
            while done < sends && tries < 8 {
                tries += 1;
                let ok = create(&http, &url, &credential, account, amount, &key, &recorder).await;
                if ok {
                    if done == 0 {
                        created.fetch_add(1, Ordering::Relaxed);
                    }
                    done += 1;
                } else {
                    tokio::time::sleep(Duration::from_millis(100 * 2u64.pow(tries.min(5)))).await;
                }
            }
        });
    }
    while tasks.join_next().await.is_some() {}
}

/// One create, recorded; `true` when it was answered 2xx.
pub(super) async fn create(
    http: &reqwest::Client,
    url: &str,
    credential: &str,
    account: uuid::Uuid,
    amount: i64,
    key: &str,
    recorder: &Recorder,
) -> bool {
    let op = recorder.new_op();
    let asked = Value {
        account: Some(account),
        amount: Some(amount),
        idempotency_key: Some(key.to_owned()),
        ..Value::default()
    };
    recorder.record("client", Type::Invoke, F::Create, op, asked.clone());
    let answer = http
        .post(format!("{url}/v1/payouts"))
        .bearer_auth(credential)
        .json(&json!({"accountId": account, "amountMinor": amount, "currency": "EUR", "idempotencyKey": key}))
        .send()
        .await;
    let (kind, value, ok) = match answer {
        Ok(r) => {
            let status = r.status();
            let body: serde_json::Value = r.json().await.unwrap_or(serde_json::Value::Null);
            let mut v = Value {
                status: Some(status.as_u16()),
                ..asked
            };
            if status.is_success() {
                v.payout = body["payoutId"].as_str().and_then(|s| s.parse().ok());
                v.state = body["state"].as_str().map(str::to_owned);
                (Type::Ok, v, true)
            } else if status.is_client_error() {
                v.code = body["code"].as_str().map(str::to_owned);
                (Type::Fail, v, false)
            } else {
                v.error = Some(format!("answered {status}"));
                (Type::Info, v, false)
            }
        }
        Err(e) => (
            Type::Info,
            Value {
                error: Some(if e.is_timeout() {
                    "timeout".into()
                } else {
                    "no answer".into()
                }),
                ..asked
            },
            false,
        ),
    };
    recorder.record("client", kind, F::Create, op, value);
    ok
}
