//! Signed grants at payment-resource, over HTTP against a real paydb: every fenced route (claim,
//! adoption, reservation, plain transition, ending, posting) refuses a token whose grant is missing,
//! forged, altered, by an unknown key, for another token, for another account or for a lock that is
//! no account — 403 with its code, `grant_refused_total{code}` counted — and leaves every table and
//! sequence of paydb exactly as it was; the rightful grant passes. A rotated key set accepts both
//! keys, a set without the old key refuses it. The negative control switches verification off and
//! shows the attack the grants stop: another account's token fences the rightful holder out.

mod common;

use common::{Fixture, GRANT_KEY, fixture, grant, grant_by};
use dlock_common::grant::{GrantPolicy, account_key};
use dlock_grant::{KeyId, PublicKeys, SigningKey};
use payment_resource::model::PayoutState;
use payment_resource::{Config, RunningServer};
use reqwest::Client;
use serde_json::{Value, json};
use uuid::Uuid;

const SETTING: &str = "TEST_GRANT_VERIFICATION_ENABLED";

struct Api {
    server: RunningServer,
    http: Client,
}

impl Api {
    async fn start(f: &Fixture, grants: GrantPolicy) -> Api {
        let server = payment_resource::spawn(
            Config::ephemeral(f.db.app_url())
                .with_credentials(common::credentials())
                .with_grants(grants),
        )
        .await
        .expect("spawn");
        Api {
            server,
            http: Client::new(),
        }
    }

    /// A fenced call with exactly this token and grant header (none when `None`).
    async fn call(&self, route: &Route, payout: Uuid, token: i64, grant: Option<&str>) -> (u16, Value) {
        let mut req = self
            .http
            .post(format!(
                "{}/v1/payouts/{payout}/{}",
                self.server.url(),
                route.path
            ))
            .bearer_auth(common::EXECUTOR_TOKEN)
            .header("X-Fencing-Token", token.to_string());
        if let Some(g) = grant {
            req = req.header("X-Fencing-Grant", g);
        }
        if let Some(body) = &route.body {
            req = req.json(body);
        }
        let resp = req.send().await.expect("request");
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    async fn refusals(&self, code: &str) -> f64 {
        let text = self
            .http
            .get(format!("{}/metrics", self.server.url()))
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("text");
        dlock_testkit::metrics::metric_value(&text, "grant_refused_total", &[("code", code)]).unwrap_or(0.0)
    }
}

/// One fenced route and the state a payout must be in for it.
struct Route {
    name: &'static str,
    path: &'static str,
    body: Option<Value>,
}

fn routes() -> Vec<Route> {
    let transition = |from: &str, to: &str| Some(json!({"from": from, "to": to}));
    vec![
        Route {
            name: "claim",
            path: "claim",
            body: Some(json!({"ownerId": "attacker"})),
        },
        Route {
            name: "adopt",
            path: "claim",
            body: Some(json!({"ownerId": "attacker"})),
        },
        Route {
            name: "reserve",
            path: "transition",
            body: transition("CLAIMED", "RAIL_SUBMITTED"),
        },
        Route {
            name: "transition",
            path: "transition",
            body: transition("RAIL_SUBMITTED", "RAIL_ACKED"),
        },
        Route {
            name: "end",
            path: "transition",
            body: transition("CLAIMED", "FAILED"),
        },
        Route {
            name: "post",
            path: "post",
            body: None,
        },
    ]
}

/// The holder's token: every payout below is held (claimed) with it.
const HOLDER: i64 = 5;
/// The attacker's token: higher than the holder's, so that only the grant can stop it.
const ATTACKER: i64 = 50;

/// A payout of `account` in the state `route` needs, held with [`HOLDER`] (PENDING for a claim).
async fn payout_for(f: &Fixture, route: &Route, account: Uuid) -> Uuid {
    if route.name == "post" {
        return f.acked(account, 100, HOLDER).await.payout_id;
    }
    let p = f.pending(account, 100).await;
    let id = p.payout_id;
    let claim = || f.payouts.claim(id, "holder", common::tok(HOLDER));
    let to = |from, to| f.payouts.transition(id, from, to, common::tok(HOLDER));
    match route.name {
        "claim" => {}
        "adopt" | "reserve" | "end" => {
            claim().await.expect("claim");
        }
        "transition" => {
            claim().await.expect("claim");
            to(PayoutState::Claimed, PayoutState::RailSubmitted)
                .await
                .expect("reserve");
        }
        other => unreachable!("{other}"),
    }
    id
}

/// Every way a grant can fail, with the code it must be refused with.
fn bad_grants(account: Uuid) -> Vec<(&'static str, Option<String>, i64, &'static str)> {
    let other_account = Uuid::new_v4();
    let stranger = SigningKey::generate(KeyId::new("stranger").expect("id"));
    let rightful = grant(account, ATTACKER);
    let mut flipped = rightful.clone().into_bytes();
    let at = flipped.len() - 5; // inside the signature
    flipped[at] ^= 0x01;
    let flipped = String::from_utf8(flipped).expect("ascii");
    vec![
        ("a forged integer with no grant", None, ATTACKER, "GRANT_INVALID"),
        (
            "a grant for another account",
            Some(grant(other_account, ATTACKER)),
            ATTACKER,
            "GRANT_WRONG_RESOURCE",
        ),
        (
            "a grant for a key that is no account",
            Some(grant_by(&GRANT_KEY, "bench:1", ATTACKER)),
            ATTACKER,
            "GRANT_WRONG_RESOURCE",
        ),
        (
            "a grant with a flipped byte",
            Some(flipped),
            ATTACKER,
            "GRANT_INVALID",
        ),
        (
            "a grant by an unknown key",
            Some(grant_by(&stranger, &account_key(account), ATTACKER)),
            ATTACKER,
            "GRANT_UNKNOWN_SIGNER",
        ),
        (
            "a grant whose token differs from the header",
            Some(grant(account, ATTACKER + 1)),
            ATTACKER,
            "GRANT_INVALID",
        ),
    ]
}

#[tokio::test]
async fn every_fenced_route_refuses_every_bad_grant_and_paydb_is_untouched() {
    let f = fixture().await;
    let api = Api::start(&f, common::grants()).await;
    let account = f.customer(1_000_000).await;
    for route in routes() {
        let payout = payout_for(&f, &route, account).await;
        for (what, grant_header, token, code) in bad_grants(account) {
            let before = f.db.digest().await;
            let counted = api.refusals(code).await;
            let (status, body) = api.call(&route, payout, token, grant_header.as_deref()).await;
            assert_eq!(
                (status, body["code"].as_str()),
                (403, Some(code)),
                "{} with {what}: {body}",
                route.name
            );
            assert!(body["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");
            assert_eq!(
                f.db.digest().await,
                before,
                "{} with {what} changed paydb",
                route.name
            );
            assert_eq!(
                api.refusals(code).await,
                counted + 1.0,
                "{} with {what}",
                route.name
            );
        }
        // The same call with the rightful grant of the same token goes through: what refused the
        // others was their grant, nothing else.
        let (status, body) = api
            .call(&route, payout, ATTACKER, Some(&grant(account, ATTACKER)))
            .await;
        assert_eq!(status, 200, "{} with the rightful grant: {body}", route.name);
    }
    api.server.shutdown().await.expect("stop");
}

#[tokio::test]
async fn a_rotated_key_is_accepted_and_a_removed_one_refused() {
    let f = fixture().await;
    let account = f.customer(1_000_000).await;
    let new_key = SigningKey::generate(KeyId::new("test-k2").expect("id"));
    let policy = |keys: Vec<&SigningKey>| {
        let set = PublicKeys::new(keys.into_iter().map(SigningKey::public_key).collect()).expect("set");
        GrantPolicy::new(true, set, SETTING).expect("keys")
    };
    let claim = Route {
        name: "claim",
        path: "claim",
        body: Some(json!({"ownerId": "holder"})),
    };
    let by = |key: &SigningKey, token: i64| grant_by(key, &account_key(account), token);

    // During the rotation: both keys verify.
    let both = Api::start(&f, policy(vec![&GRANT_KEY, &new_key])).await;
    let a = f.pending(account, 100).await.payout_id;
    let b = f.pending(account, 100).await.payout_id;
    assert_eq!(both.call(&claim, a, 7, Some(&by(&GRANT_KEY, 7))).await.0, 200);
    assert_eq!(both.call(&claim, b, 8, Some(&by(&new_key, 8))).await.0, 200);
    both.server.shutdown().await.expect("stop");

    // After it: the old key is gone from the set, and its grants are refused.
    let after = Api::start(&f, policy(vec![&new_key])).await;
    let c = f.pending(account, 100).await.payout_id;
    let before = f.db.digest().await;
    let (status, body) = after.call(&claim, c, 9, Some(&by(&GRANT_KEY, 9))).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (403, Some("GRANT_UNKNOWN_SIGNER")),
        "{body}"
    );
    assert_eq!(f.db.digest().await, before);
    assert_eq!(after.call(&claim, c, 9, Some(&by(&new_key, 9))).await.0, 200);
    after.server.shutdown().await.expect("stop");
}

/// The attack of the issue, at payment-resource: the holder of `account:B` claims B's payout with
/// its token and grant; an attacker holding a *higher* token granted on `account:A` presents it for
/// B's payout; the holder carries on. `Err` names the violation: the attacker was let in, or the
/// holder was fenced out of its own account.
async fn cross_account_token(grants: GrantPolicy) -> Result<(), String> {
    let f = fixture().await;
    let api = Api::start(&f, grants).await;
    let (a, b) = (f.customer(1_000_000).await, f.customer(1_000_000).await);
    let payout = f.pending(b, 100).await.payout_id;
    let claim = |owner: &str| Route {
        name: "claim",
        path: "claim",
        body: Some(json!({"ownerId": owner})),
    };
    let reserve = Route {
        name: "reserve",
        path: "transition",
        body: Some(json!({"from": "CLAIMED", "to": "RAIL_SUBMITTED"})),
    };
    let (status, body) = api
        .call(&claim("holder-b"), payout, HOLDER, Some(&grant(b, HOLDER)))
        .await;
    assert_eq!(status, 200, "the holder's own claim: {body}");

    let (status, body) = api
        .call(&claim("attacker"), payout, ATTACKER, Some(&grant(a, ATTACKER)))
        .await;
    let mut violations = Vec::new();
    if status != 403 {
        violations.push(format!(
            "account A's grant was accepted for B's payout: {status} {body}"
        ));
    }
    let (status, body) = api.call(&reserve, payout, HOLDER, Some(&grant(b, HOLDER))).await;
    if status != 200 {
        violations.push(format!(
            "the rightful holder of account B was fenced out: {status} {}",
            body["code"]
        ));
    }
    api.server.shutdown().await.expect("stop");
    if violations.is_empty() {
        Ok(())
    } else {
        Err(violations.join("; "))
    }
}

#[tokio::test]
async fn another_accounts_token_cannot_fence_the_rightful_holder_out() {
    cross_account_token(common::grants()).await.unwrap();
}

#[tokio::test]
async fn negative_control_with_verification_off_another_accounts_token_fences_the_holder_out() {
    let violation = cross_account_token(GrantPolicy::Off)
        .await
        .expect_err("with verification off, the attack must succeed");
    assert!(
        violation.contains("was accepted")
            && violation.contains("fenced out")
            && violation.contains("FENCED_OUT"),
        "{violation}"
    );
}
