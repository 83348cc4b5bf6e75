//! Payouts as the cluster tier's tests create them: through payment-resource's Service URL, on the
//! synthetic demo accounts.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use serde_json::json;

use crate::stage::Stage;

/// One key of a Secret of the stage's namespace, as text (`None`: no such key, or not UTF-8).
pub async fn secret_text(st: &Stage, name: &str, key: &str) -> Option<String> {
    let s: Secret = st.must_get(name).await;
    let bytes = s.data?.get(key)?.0.clone();
    String::from_utf8(bytes).ok()
}

/// What a client of PaymentStack `stack` needs: an HTTP client through the stage's proxy (which
/// resolves the Services), the stack's client credential, and payment-resource's Service URL.
pub async fn stack_client(st: &Stage, stack: &str) -> (reqwest::Client, String, String) {
    let proxy = st.proxy.clone().expect("this stage runs the proxy");
    let http = reqwest::Client::builder()
        .proxy(reqwest::Proxy::http(proxy.url()).expect("the proxy URL"))
        .timeout(Duration::from_secs(10))
        .build()
        .expect("an HTTP client");
    let token = secret_text(st, &format!("{stack}-payment-credentials"), "client")
        .await
        .expect("the stack's client credential");
    let url = format!("http://{stack}-payment-resource.{}.svc:8080", st.ns);
    (http, token, url)
}

/// Creates payout `run-i` through payment-resource's Service URL (through the proxy), retrying
/// while the proxy has no endpoint for it yet; the same idempotency key makes a retry one payout.
pub async fn create_payout(http: &reqwest::Client, url: &str, token: &str, run: &str, i: u32) {
    let body = json!({
        "accountId": format!("00000000-0000-4000-8000-0000000000{:02}", 1 + i % 10),
        "amountMinor": 100 + i64::from(i),
        "currency": "EUR",
        "idempotencyKey": format!("{run}-{i}"),
    });
    let outcome =
        dlock_testkit::wait::poll(Duration::from_secs(60), Duration::from_millis(100), async || {
            let resp = http
                .post(url)
                .bearer_auth(token)
                .json(&body)
                .send()
                .await
                .map_err(|e| e.to_string())?;
            match resp.status().as_u16() {
                200 | 201 => Ok(()),
                // A pod rolling (the proxy has no endpoint for a moment) or not ready yet.
                502 | 503 => Err(format!("{}", resp.status())),
                code => panic!(
                    "create payout {run}-{i}: {code}: {}",
                    resp.text().await.unwrap_or_default()
                ),
            }
        })
        .await;
    if let Err(last) = outcome {
        panic!("payout {run}-{i} could not be created within 60 s: {last}");
    }
}
