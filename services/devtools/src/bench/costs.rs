//! What a signed grant and a lock cycle's JSON cost, measured in this process: the parts of a
//! lock-server row's CPU that no store explains (`bench lock`), and the signature's share of a
//! payout (`bench payouts`).

use std::time::Instant;

use anyhow::Result;
use uuid::Uuid;

use crate::stack::run_key;

/// How many grants [`grant_cost`] signs and verifies.
const GRANT_COST_N: u32 = 2_000;

/// The cost of signed grants on one core, measured in this process: µs to sign one grant (what
/// lock-server adds to each acquire and renew) and µs to check one (what a resource adds to each
/// fenced write: the header read, the signature, the token and the account key).
pub(super) fn grant_cost(n: u32) -> Result<(f64, f64)> {
    use dlock_common::grant::{FENCING_GRANT_HEADER, GrantPolicy};
    let key = run_key("bench")?;
    let policy = GrantPolicy::new(
        true,
        dlock_grant::PublicKeys::new(vec![key.public_key()])?,
        "bench",
    )?;
    let lock_key = dlock_common::grant::account_key(Uuid::new_v4());
    let session = Uuid::new_v4();
    let started = Instant::now();
    let mut grants = Vec::with_capacity(n as usize);
    for token in 1..=i64::from(n) {
        grants.push(bench_grant(&key, &lock_key, token, session)?);
    }
    let sign_us = started.elapsed().as_secs_f64() * 1e6 / f64::from(n);
    let started = Instant::now();
    for (token, grant) in (1..).zip(&grants) {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(FENCING_GRANT_HEADER, grant.parse()?);
        policy
            .check(&headers, dlock_common::FencingToken::new(token)?)
            .map_err(|e| anyhow::anyhow!("a grant just signed was refused: {e}"))?;
    }
    let verify_us = started.elapsed().as_secs_f64() * 1e6 / f64::from(n);
    Ok((sign_us, verify_us))
}

/// Prints [`grant_cost`]'s line and returns it (µs to sign, µs to verify).
pub(super) fn print_grant_cost() -> Result<(f64, f64)> {
    let (sign, verify) = grant_cost(GRANT_COST_N)?;
    println!(
        "signed grants (Ed25519, this process, {GRANT_COST_N} each): sign {sign:.1} µs/grant (lock-server, per acquire and renew), \
         verify {verify:.1} µs/write (payment-resource, rail-proxy, per fenced write)"
    );
    Ok((sign, verify))
}

/// A grant as lock-server signs it, for the bench's owner on lock service "bench".
pub(super) fn bench_grant(
    key: &dlock_grant::SigningKey,
    lock_key: &str,
    token: i64,
    session: Uuid,
) -> Result<String> {
    Ok(key.sign(&dlock_grant::Claims {
        lock_service: "bench",
        lock_key,
        token,
        owner_id: "bench-owner",
        session_id: session,
    })?)
}

/// How many cycles [`json_cost`] encodes and decodes.
const JSON_COST_N: u32 = 20_000;

/// The JSON of one lock cycle, measured in this process: µs to encode and decode everything an
/// acquire and a release carry, on both ends — the acquire request (client encodes, lock-server
/// decodes), the grant (lock-server encodes, client decodes) and the release's answer (the same) —
/// with `grant` (a signed grant) in it if given. What the HTTP rows' CPU per cycle holds of JSON.
pub(super) fn json_cost(n: u32, grant: Option<String>) -> Result<f64> {
    use dlock_wire::lock::{AcquireRequest, LockGrant, LockReleased};
    let now = chrono::Utc::now();
    let session = Uuid::new_v4();
    let started = Instant::now();
    for i in 1..=i64::from(n) {
        let key = format!("bench/{i:08}");
        let request = serde_json::to_vec(&AcquireRequest {
            session_id: session,
            owner_id: "bench-owner".to_owned(),
            ttl_ms: 30_000,
            wait_ms: None,
        })?;
        let request: AcquireRequest = serde_json::from_slice(&request)?;
        let token = dlock_common::FencingToken::new(i)?;
        let granted = serde_json::to_vec(&LockGrant {
            lock_key: key,
            fencing_token: token,
            owner_id: request.owner_id,
            session_id: request.session_id,
            acquired_at: now,
            expires_at: now,
            grant: grant.clone(),
        })?;
        let granted: LockGrant = serde_json::from_slice(&granted)?;
        let released = serde_json::to_vec(&LockReleased {
            lock_key: granted.lock_key,
            fencing_token: granted.fencing_token,
            released: true,
            stale: false,
        })?;
        let released: LockReleased = serde_json::from_slice(&released)?;
        anyhow::ensure!(released.released, "the release's answer did not read back");
    }
    Ok(started.elapsed().as_secs_f64() * 1e6 / f64::from(n))
}

/// Prints [`json_cost`]'s line.
pub(super) fn print_json_cost() -> Result<()> {
    let grant = bench_grant(&run_key("bench")?, "bench/00000001", 1, Uuid::new_v4())?;
    let unsigned = json_cost(JSON_COST_N, None)?;
    let signed = json_cost(JSON_COST_N, Some(grant))?;
    println!(
        "JSON per cycle (this process, {JSON_COST_N} cycles; acquire request, grant and release answer, \
         each encoded and decoded): {unsigned:.1} µs unsigned, {signed:.1} µs with a signed grant — \
         on both ends together, against the CPU per cycle above"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_cost_reads_a_cycle_back_with_and_without_a_signed_grant() {
        let grant = bench_grant(&run_key("bench").unwrap(), "bench/00000001", 1, Uuid::new_v4()).unwrap();
        assert!(json_cost(10, None).unwrap() > 0.0);
        assert!(json_cost(10, Some(grant)).unwrap() > 0.0);
    }
}
