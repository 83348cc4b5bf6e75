//! Signed grants at a protected resource (docs/security.md, "Signed grants"): the
//! `X-Fencing-Grant` header beside `X-Fencing-Token`, the resource's [`GrantPolicy`] (verify with
//! the lock service's public keys — the default — or off, explicitly), the three refusal codes
//! (403, nothing written), the counter `grant_refused_total{code}` and the log event
//! `grant_refused`. The cryptography is `dlock_grant`'s; this is what payment-resource and
//! rail-proxy share around it.
//!
//! A token is accepted only when the grant verifies under a configured public key, states exactly
//! the presented token, and was granted on `account:<the payout's account>`. The first two are
//! checked from the request alone ([`GrantPolicy::check`], before any database work); the account
//! is known only with the payout, so [`Granted::check_account`] runs where the payout is first read.

use std::path::PathBuf;
use std::sync::Arc;

use axum::http::{HeaderMap, StatusCode};
use dlock_grant::{Grant, GrantError, PublicKeys};
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use uuid::Uuid;

use crate::error::ApiError;
use crate::memo::Memo;
use crate::token::FencingToken;

/// The header that carries the signed grant of the presented token (lock-server's `LockGrant.grant`).
pub use dlock_wire::FENCING_GRANT_HEADER;

/// lock-server's signing key (`<keyId>=<base64url seed>`): this variable, or the file named by the
/// same with `_FILE` — never a flag.
pub const SIGNING_KEY_ENV: &str = "DLOCK_GRANT_SIGNING_KEY";
/// The lock service id lock-server signs into every grant.
pub const LOCK_SERVICE_ID_ENV: &str = "DLOCK_LOCK_SERVICE_ID";

/// The environment variables of a resource's public keys (not secret: a flag works too).
pub const PUBLIC_KEYS_ENV: &str = "DLOCK_GRANT_PUBLIC_KEYS";
pub const PUBLIC_KEYS_FILE_ENV: &str = "DLOCK_GRANT_PUBLIC_KEYS_FILE";

/// The lock key that guards an account's payouts, spelled exactly as the executors lock it: one
/// spelling only, or two spellings of one account would be two locks with two live holders.
pub fn account_key(account_id: Uuid) -> String {
    format!("account:{}", account_id.hyphenated())
}

/// The account of a lock key of [`account_key`]'s exact form, `None` for any other key.
pub fn account_of(lock_key: &str) -> Option<Uuid> {
    let id = Uuid::try_parse(lock_key.strip_prefix("account:")?).ok()?;
    (account_key(id) == lock_key).then_some(id)
}

/// The machine-readable code of a grant refusal (also the `code` label of `grant_refused_total`).
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum RefusalCode {
    /// No grant, a malformed one, a signature that does not verify, or a grant for another token.
    GRANT_INVALID,
    /// A well-formed grant signed by a key this resource does not trust (unknown, or retired).
    GRANT_UNKNOWN_SIGNER,
    /// An authentic grant for another lock than `account:<the payout's account>`.
    GRANT_WRONG_RESOURCE,
}

impl RefusalCode {
    pub const ALL: [RefusalCode; 3] = [
        RefusalCode::GRANT_INVALID,
        RefusalCode::GRANT_UNKNOWN_SIGNER,
        RefusalCode::GRANT_WRONG_RESOURCE,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RefusalCode::GRANT_INVALID => "GRANT_INVALID",
            RefusalCode::GRANT_UNKNOWN_SIGNER => "GRANT_UNKNOWN_SIGNER",
            RefusalCode::GRANT_WRONG_RESOURCE => "GRANT_WRONG_RESOURCE",
        }
    }
}

/// A refused grant: 403 with the code. Terminal for that grant (the caller must not retry it; a
/// new acquire brings a new grant).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct GrantRefused {
    pub code: RefusalCode,
    pub message: String,
}

impl GrantRefused {
    fn new(code: RefusalCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

/// 403, not 400 or 409: the request is well-formed and the resource's state did not decide — the
/// caller is simply not authorized to write this resource with this token. It is a refusal of an
/// authorization, like `FORBIDDEN`, and distinct from the 409 `FENCED_OUT` an executor treats as
/// "a newer holder exists".
impl From<GrantRefused> for ApiError {
    fn from(r: GrantRefused) -> Self {
        ApiError::new(StatusCode::FORBIDDEN, r.code.as_str(), r.message)
    }
}

/// What a resource does with grants.
#[derive(Debug, Clone)]
pub enum GrantPolicy {
    /// The default: every fenced request needs a grant signed by one of these keys.
    Verify(Arc<TrustedKeys>),
    /// `…_GRANT_VERIFICATION_ENABLED=false`: grants are not read at all (a rolling migration of a
    /// deployment whose executors do not send them yet). Logged as a WARN at start-up.
    Off,
}

/// How many verified grants a resource remembers; past it the memory starts again empty. A payout
/// presents one grant (its token's) in every fenced write, so a few thousand cover every payout in
/// flight many times over; a few MiB at most.
pub const VERIFIED_GRANTS_KEPT: usize = 4096;

/// The public keys a verifying resource trusts, and the grants they verified lately.
///
/// A payout presents the same grant in each of its fenced writes (claim, two transitions, post; the
/// submission at rail-proxy), and an Ed25519 verification is most of a fenced write's CPU at the
/// resource (docs/benchmarks.md). The outcome of verifying a grant depends only on its exact text
/// and on these keys, which a running resource never changes (a key rotation restarts it with a new
/// set), so a grant whose text was verified before is accepted again without the signature
/// arithmetic. Only verified grants are kept: a refused one is checked afresh every time, and a text
/// that differs in any byte is a different grant.
#[derive(Debug)]
pub struct TrustedKeys {
    keys: PublicKeys,
    verified: Memo<Box<str>, Grant>,
}

impl Default for TrustedKeys {
    fn default() -> Self {
        TrustedKeys::new(PublicKeys::default())
    }
}

impl TrustedKeys {
    pub fn new(keys: PublicKeys) -> Self {
        TrustedKeys {
            keys,
            verified: Memo::new(VERIFIED_GRANTS_KEPT),
        }
    }

    pub fn keys(&self) -> &PublicKeys {
        &self.keys
    }

    /// [`PublicKeys::verify`], remembering what verified.
    pub fn verify(&self, wire: &str) -> Result<Grant, GrantError> {
        if let Some(grant) = self.verified.get(wire) {
            return Ok(grant);
        }
        let grant = self.keys.verify(wire)?;
        self.verified.insert(wire.into(), grant.clone());
        Ok(grant)
    }

    /// How many verified grants are remembered now.
    pub fn remembered(&self) -> usize {
        self.verified.len()
    }
}

/// What a verified grant says about the resource, for the check that needs the payout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Granted {
    /// An authentic grant for the presented token on `account:<id>`.
    Account(Uuid),
    /// Verification is off: nothing is known, nothing is checked.
    Unverified,
}

impl Granted {
    /// The account a verified grant was for; `None` when verification is off.
    pub fn account(self) -> Option<Uuid> {
        match self {
            Granted::Account(a) => Some(a),
            Granted::Unverified => None,
        }
    }

    /// The payout being written belongs to `account`: the grant must be for exactly that account.
    pub fn check_account(self, account: Uuid) -> Result<(), GrantRefused> {
        match self {
            Granted::Account(granted) if granted != account => Err(GrantRefused::new(
                RefusalCode::GRANT_WRONG_RESOURCE,
                format!(
                    "the grant is for {}, but this payout belongs to {}",
                    account_key(granted),
                    account_key(account)
                ),
            )),
            _ => Ok(()),
        }
    }
}

/// What a fenced call presents to a resource's services: the token, and what its checked grant said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Presented {
    pub token: FencingToken,
    pub granted: Granted,
}

/// A bare token: no grant was checked. What the HTTP edge passes when verification is off, and what
/// in-process callers (tests of the fences themselves) pass; the edge passes [`Granted::Account`]
/// whenever it verified one.
impl From<FencingToken> for Presented {
    fn from(token: FencingToken) -> Self {
        Presented {
            token,
            granted: Granted::Unverified,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum GrantConfigError {
    #[error(
        "grant verification is on ({setting}) but no public keys are configured: set \
         {PUBLIC_KEYS_ENV} or {PUBLIC_KEYS_FILE_ENV} to the lock service's public keys, or switch \
         verification off explicitly with {setting}=false"
    )]
    NoKeys { setting: &'static str },
    #[error("{PUBLIC_KEYS_FILE_ENV}: cannot read {path}: {error}")]
    File { path: String, error: String },
    #[error("{0}")]
    Keys(#[from] dlock_grant::KeyError),
}

impl GrantPolicy {
    /// The policy of a service whose switch `setting` is `enabled`, with `keys` (already parsed).
    /// On with no key is refused: a resource that trusts no signer would refuse every write, and
    /// silently accepting every write would be worse.
    pub fn new(enabled: bool, keys: PublicKeys, setting: &'static str) -> Result<Self, GrantConfigError> {
        if !enabled {
            return Ok(GrantPolicy::Off);
        }
        if keys.is_empty() {
            return Err(GrantConfigError::NoKeys { setting });
        }
        Ok(GrantPolicy::Verify(Arc::new(TrustedKeys::new(keys))))
    }

    /// Refuses a verifying policy without keys (a configuration built in code skips [`Self::new`]).
    pub fn validate(&self, setting: &'static str) -> Result<(), GrantConfigError> {
        match self {
            GrantPolicy::Verify(trusted) if trusted.keys().is_empty() => {
                Err(GrantConfigError::NoKeys { setting })
            }
            _ => Ok(()),
        }
    }

    pub fn is_on(&self) -> bool {
        matches!(self, GrantPolicy::Verify(_))
    }

    /// At start-up: a WARN when verification is off (like the fencing kill switches), an INFO with
    /// the trusted key ids when it is on.
    pub fn announce(&self, service: &str, setting: &'static str) {
        match self {
            GrantPolicy::Off => tracing::warn!(
                event = "grant_verification_disabled",
                service,
                key = setting,
                "GRANT VERIFICATION IS OFF: a fencing token is accepted without a signed grant, so a token granted on any lock can fence this resource's accounts"
            ),
            GrantPolicy::Verify(trusted) => tracing::info!(
                event = "grant_verification_enabled",
                service,
                key_ids = %trusted.keys().ids().map(|k| k.as_str()).collect::<Vec<_>>().join(","),
            ),
        }
    }

    /// The checks that need only the request: a grant in `X-Fencing-Grant`, signed by a trusted
    /// key, for exactly `token`, on an account key. Runs before any database work.
    pub fn check(&self, headers: &HeaderMap, token: FencingToken) -> Result<Granted, GrantRefused> {
        let keys = match self {
            GrantPolicy::Off => return Ok(Granted::Unverified),
            GrantPolicy::Verify(keys) => keys,
        };
        let invalid = |m: String| GrantRefused::new(RefusalCode::GRANT_INVALID, m);
        let value = headers.get(FENCING_GRANT_HEADER).ok_or_else(|| {
            invalid(format!(
                "no {FENCING_GRANT_HEADER} header: a fencing token is accepted only inside the grant \
                 the lock service signed for it"
            ))
        })?;
        let wire = value
            .to_str()
            .map_err(|_| invalid(format!("the {FENCING_GRANT_HEADER} header is not ASCII")))?;
        let grant = keys.verify(wire).map_err(|e| match e {
            GrantError::UnknownSigner(_) => {
                GrantRefused::new(RefusalCode::GRANT_UNKNOWN_SIGNER, e.to_string())
            }
            GrantError::Malformed(_) | GrantError::BadSignature(_) => invalid(e.to_string()),
        })?;
        if grant.token != token.get() {
            return Err(invalid(format!(
                "the grant is for fencing token {}, but the request presents {}",
                grant.token, token
            )));
        }
        match account_of(&grant.lock_key) {
            Some(account) => Ok(Granted::Account(account)),
            None => Err(GrantRefused::new(
                RefusalCode::GRANT_WRONG_RESOURCE,
                format!(
                    "the grant is for lock key {:?}, not for an account (account:<uuid>)",
                    grant.lock_key
                ),
            )),
        }
    }
}

/// A resource's error type that can carry a grant refusal, so that [`GrantGate::fenced`] can count
/// one found deep in a service (the wrong account) like one found at the edge.
pub trait CarriesRefusal: From<GrantRefused> {
    fn refusal(&self) -> Option<&GrantRefused>;
}

/// A resource's grant policy and its refusal counter: what each fenced handler goes through.
#[derive(Debug, Clone)]
pub struct GrantGate {
    pub policy: GrantPolicy,
    pub metrics: GrantMetrics,
}

impl GrantGate {
    /// One fenced call: the grant checked from the request alone ([`GrantPolicy::check`]) before
    /// anything is read, then `call` with what it said — the call checks the account where it first
    /// reads the payout ([`Granted::check_account`]). A refusal found at either point is counted and
    /// logged here, once; nothing was written.
    pub async fn fenced<T, E, F, Fut>(
        &self,
        operation: &'static str,
        payout_id: Uuid,
        token: FencingToken,
        headers: &HeaderMap,
        call: F,
    ) -> Result<T, E>
    where
        E: CarriesRefusal,
        F: FnOnce(Presented) -> Fut,
        Fut: std::future::Future<Output = Result<T, E>>,
    {
        let result = match self.policy.check(headers, token) {
            Ok(granted) => call(Presented { token, granted }).await,
            Err(refused) => Err(refused.into()),
        };
        if let Some(refused) = result.as_ref().err().and_then(CarriesRefusal::refusal) {
            self.metrics.refused(refused, operation, Some(payout_id), token);
        }
        result
    }
}

/// The `code` label of `grant_refused_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabel {
    pub code: RefusalCode,
}

/// `grant_refused_total{code}`: every refused grant, counted once where it is refused, with the log
/// event `grant_refused`. Must stay at zero in a healthy deployment.
#[derive(Debug, Clone, Default)]
pub struct GrantMetrics {
    refused: Family<CodeLabel, Counter>,
}

impl GrantMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        for code in RefusalCode::ALL {
            let _ = m.refused.get_or_create(&CodeLabel { code });
        }
        registry.register(
            "grant_refused",
            "Fenced requests refused because their signed grant was missing, invalid, by an unknown signer or for another resource",
            m.refused.clone(),
        );
        m
    }

    /// Counts the refusal and logs `grant_refused` with what was asked (ids go to the log only).
    pub fn refused(
        &self,
        r: &GrantRefused,
        operation: &'static str,
        payout_id: Option<Uuid>,
        token: FencingToken,
    ) {
        self.refused.get_or_create(&CodeLabel { code: r.code }).inc();
        tracing::warn!(
            event = "grant_refused",
            code = r.code.as_str(),
            operation,
            payout_id = payout_id.map(|p| p.to_string()),
            presented = token.get(),
            reason = %r.message,
            "fenced request refused: its grant does not authorize this token on this resource"
        );
    }

    pub fn count(&self, code: RefusalCode) -> u64 {
        self.refused.get_or_create(&CodeLabel { code }).get()
    }
}

/// The resources' public-key settings (not secret: a flag, the environment, or a file such as a
/// mounted ConfigMap). The on/off switch is each service's own setting.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct PublicKeyArgs {
    /// The lock service's grant public keys: `<keyId>=<base64url>` entries separated by commas.
    #[arg(long, env = PUBLIC_KEYS_ENV)]
    pub grant_public_keys: Option<String>,
    /// A file holding the same (entries separated by commas or newlines).
    #[arg(long, env = PUBLIC_KEYS_FILE_ENV, conflicts_with = "grant_public_keys")]
    pub grant_public_keys_file: Option<PathBuf>,
}

impl PublicKeyArgs {
    /// The policy: verification per `enabled` (the switch named `setting`), with these keys.
    pub fn policy(&self, enabled: bool, setting: &'static str) -> Result<GrantPolicy, GrantConfigError> {
        if !enabled {
            return Ok(GrantPolicy::Off);
        }
        let text = match (&self.grant_public_keys, &self.grant_public_keys_file) {
            (Some(text), _) => text.clone(),
            (None, Some(path)) => std::fs::read_to_string(path).map_err(|e| GrantConfigError::File {
                path: path.display().to_string(),
                error: e.to_string(),
            })?,
            (None, None) => String::new(),
        };
        GrantPolicy::new(true, PublicKeys::parse(&text)?, setting)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;
    use dlock_grant::{Claims, KeyId, SigningKey};

    const SETTING: &str = "TEST_GRANT_VERIFICATION_ENABLED";

    fn key(id: &str) -> SigningKey {
        SigningKey::generate(KeyId::new(id).unwrap())
    }

    fn policy(keys: &[&SigningKey]) -> GrantPolicy {
        let set = PublicKeys::new(keys.iter().map(|k| k.public_key()).collect()).unwrap();
        GrantPolicy::new(true, set, SETTING).unwrap()
    }

    fn grant(k: &SigningKey, lock_key: &str, token: i64) -> String {
        k.sign(&Claims {
            lock_service: "test",
            lock_key,
            token,
            owner_id: "w",
            session_id: Uuid::nil(),
        })
        .unwrap()
    }

    fn headers(grant: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(g) = grant {
            h.insert(FENCING_GRANT_HEADER, HeaderValue::from_str(g).unwrap());
        }
        h
    }

    fn tok(t: i64) -> FencingToken {
        FencingToken::new(t).unwrap()
    }

    fn code(r: Result<Granted, GrantRefused>) -> Option<&'static str> {
        r.err().map(|e| e.code.as_str())
    }

    #[test]
    fn an_authentic_grant_for_the_token_on_an_account_passes() {
        let k = key("k1");
        let p = policy(&[&k]);
        let a = Uuid::new_v4();
        let g = grant(&k, &account_key(a), 9);
        assert_eq!(p.check(&headers(Some(&g)), tok(9)), Ok(Granted::Account(a)));
        assert_eq!(Granted::Account(a).check_account(a), Ok(()));
        let other = Uuid::new_v4();
        assert_eq!(
            Granted::Account(a).check_account(other).unwrap_err().code,
            RefusalCode::GRANT_WRONG_RESOURCE
        );
        assert_eq!(Granted::Unverified.check_account(other), Ok(()));
    }

    fn trusted(p: &GrantPolicy) -> &TrustedKeys {
        match p {
            GrantPolicy::Verify(t) => t,
            GrantPolicy::Off => panic!("a verifying policy"),
        }
    }

    /// A grant verified once is accepted again from memory, and the memory changes no answer: a
    /// copy with one byte of its signature changed is refused (and not remembered), and the
    /// remembered grant presented with another token is refused as before.
    #[test]
    fn a_remembered_grant_is_accepted_and_nothing_else_is() {
        let k = key("k1");
        let p = policy(&[&k]);
        let a = Uuid::new_v4();
        let g = grant(&k, &account_key(a), 9);
        assert_eq!(p.check(&headers(Some(&g)), tok(9)), Ok(Granted::Account(a)));
        assert_eq!(trusted(&p).remembered(), 1);
        assert_eq!(p.check(&headers(Some(&g)), tok(9)), Ok(Granted::Account(a)));
        assert_eq!(trusted(&p).remembered(), 1);
        let mut tampered = g.clone().into_bytes();
        let last = tampered.len() - 2;
        tampered[last] = if tampered[last] == b'A' { b'B' } else { b'A' };
        let tampered = String::from_utf8(tampered).unwrap();
        assert_eq!(
            code(p.check(&headers(Some(&tampered)), tok(9))),
            Some("GRANT_INVALID")
        );
        assert_eq!(trusted(&p).remembered(), 1);
        assert_eq!(code(p.check(&headers(Some(&g)), tok(10))), Some("GRANT_INVALID"));
    }

    /// The memory is bounded: past [`VERIFIED_GRANTS_KEPT`] grants it starts again, and every grant
    /// still verifies.
    #[test]
    fn the_remembered_grants_are_bounded() {
        let k = key("k1");
        let p = policy(&[&k]);
        let a = Uuid::new_v4();
        for t in 1..=VERIFIED_GRANTS_KEPT as i64 + 1 {
            let g = grant(&k, &account_key(a), t);
            assert_eq!(p.check(&headers(Some(&g)), tok(t)), Ok(Granted::Account(a)));
            assert!(trusted(&p).remembered() <= VERIFIED_GRANTS_KEPT);
        }
        assert_eq!(trusted(&p).remembered(), 1);
    }

    #[test]
    fn each_way_a_grant_fails_has_its_code() {
        let k = key("k1");
        let stranger = key("k2");
        let p = policy(&[&k]);
        let a = account_key(Uuid::new_v4());
        let good = grant(&k, &a, 9);
        let mut flipped = good.clone().into_bytes();
        flipped[5] ^= 0x02;
        let flipped = String::from_utf8(flipped).unwrap();
        assert_eq!(code(p.check(&headers(None), tok(9))), Some("GRANT_INVALID"));
        assert_eq!(
            code(p.check(&headers(Some("garbage")), tok(9))),
            Some("GRANT_INVALID")
        );
        assert_eq!(
            code(p.check(&headers(Some(&flipped)), tok(9))),
            Some("GRANT_INVALID")
        );
        assert_eq!(
            code(p.check(&headers(Some(&good)), tok(10))),
            Some("GRANT_INVALID")
        );
        assert_eq!(
            code(p.check(&headers(Some(&grant(&stranger, &a, 9))), tok(9))),
            Some("GRANT_UNKNOWN_SIGNER")
        );
        for key in [
            "bench:1",
            "account:not-a-uuid",
            &a.to_uppercase().replace("ACCOUNT", "account"),
        ] {
            assert_eq!(
                code(p.check(&headers(Some(&grant(&k, key, 9))), tok(9))),
                Some("GRANT_WRONG_RESOURCE"),
                "{key}"
            );
        }
        // Off reads nothing.
        assert_eq!(
            GrantPolicy::Off.check(&headers(None), tok(9)),
            Ok(Granted::Unverified)
        );
    }

    #[test]
    fn on_without_keys_is_a_configuration_error_off_needs_none() {
        assert!(matches!(
            GrantPolicy::new(true, PublicKeys::default(), SETTING),
            Err(GrantConfigError::NoKeys { .. })
        ));
        assert!(GrantPolicy::new(false, PublicKeys::default(), SETTING).is_ok());
        assert!(PublicKeyArgs::default().policy(true, SETTING).is_err());
        assert!(matches!(
            PublicKeyArgs::default().policy(false, SETTING),
            Ok(GrantPolicy::Off)
        ));
        let k = key("k1");
        let args = PublicKeyArgs {
            grant_public_keys: Some(k.public_key().to_text()),
            grant_public_keys_file: None,
        };
        assert!(args.policy(true, SETTING).unwrap().is_on());
    }

    #[test]
    fn account_keys_have_one_spelling() {
        let a = Uuid::new_v4();
        assert_eq!(account_of(&account_key(a)), Some(a));
        assert_eq!(account_of(&format!("account:{}", a.simple())), None);
        assert_eq!(account_of(&format!("account:{{{a}}}")), None);
        assert_eq!(account_of(&format!("Account:{a}")), None);
        assert_eq!(account_of("account:"), None);
    }

    #[test]
    fn refusals_are_403_with_their_code_and_counted_per_code() {
        let e = ApiError::from(GrantRefused::new(RefusalCode::GRANT_UNKNOWN_SIGNER, "x"));
        assert_eq!(e.status, StatusCode::FORBIDDEN);
        assert_eq!(e.code, "GRANT_UNKNOWN_SIGNER");
        let mut registry = Registry::default();
        let m = GrantMetrics::register(&mut registry);
        m.refused(
            &GrantRefused::new(RefusalCode::GRANT_WRONG_RESOURCE, "x"),
            "claim",
            None,
            tok(1),
        );
        assert_eq!(m.count(RefusalCode::GRANT_WRONG_RESOURCE), 1);
        assert_eq!(m.count(RefusalCode::GRANT_INVALID), 0);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("grant_refused_total{code=\"GRANT_INVALID\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("grant_refused_total{code=\"GRANT_WRONG_RESOURCE\"} 1"),
            "{text}"
        );
    }
}
