//! lock-server's HTTP API as the demo scenes and the drill speak it: plain requests, the status and
//! the JSON body handed back as they came, so that a scene can show a refusal (409, 410) as it is.

use std::time::Duration;

use anyhow::{Result, anyhow, bail};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// A client of one lock-server.
pub struct Api {
    http: reqwest::Client,
    base: String,
}

impl Api {
    /// A client of the lock-server at `base`; for `https://`, trusting `ca` alone.
    pub fn new(base: String, ca: Option<&std::path::Path>) -> Result<Self> {
        let timeout = Duration::from_secs(10);
        let http = match ca {
            Some(ca) => dlock_testkit::pg::tls::client_trusting(ca, timeout)?,
            None => reqwest::Client::builder().timeout(timeout).build()?,
        };
        Ok(Self { http, base })
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> Result<(StatusCode, Value)> {
        let resp = req.send().await?;
        let status = resp.status();
        let body = resp.json::<Value>().await.unwrap_or(Value::Null);
        Ok((status, body))
    }

    pub async fn session(&self, owner: &str) -> Result<String> {
        let (s, b) = self
            .send(
                self.http
                    .post(format!("{}/v1/sessions", self.base))
                    .json(&json!({"ownerId": owner, "ttlMs": 60_000})),
            )
            .await?;
        if s != StatusCode::CREATED {
            bail!("create session: {s} {b}");
        }
        b["sessionId"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| anyhow!("no sessionId in {b}"))
    }

    pub async fn acquire(
        &self,
        key: &str,
        session: &str,
        owner: &str,
        ttl_ms: i64,
    ) -> Result<(StatusCode, Value)> {
        self.send(
            self.http
                .post(format!("{}/v1/locks/{key}/acquire", self.base))
                .json(&json!({"sessionId": session, "ownerId": owner, "ttlMs": ttl_ms})),
        )
        .await
    }

    pub async fn renew(&self, key: &str, token: i64, ttl_ms: i64) -> Result<(StatusCode, Value)> {
        self.send(
            self.http
                .post(format!("{}/v1/locks/{key}/renew", self.base))
                .header("X-Fencing-Token", token.to_string())
                .json(&json!({"ttlMs": ttl_ms})),
        )
        .await
    }

    pub async fn release(&self, key: &str, token: i64) -> Result<(StatusCode, Value)> {
        self.send(
            self.http
                .post(format!("{}/v1/locks/{key}/release", self.base))
                .header("X-Fencing-Token", token.to_string()),
        )
        .await
    }

    pub async fn read(&self, key: &str) -> Result<Value> {
        Ok(self
            .send(self.http.get(format!("{}/v1/locks/{key}", self.base)))
            .await?
            .1)
    }

    pub async fn metric(&self, name: &str) -> Result<f64> {
        let text = self
            .http
            .get(format!("{}/metrics", self.base))
            .send()
            .await?
            .text()
            .await?;
        Ok(dlock_testkit::metrics::metric_sum(&text, name, &[]))
    }
}
