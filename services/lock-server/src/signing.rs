//! Signed grants (docs/lock-api.md, "Signed grants"): lock-server signs every grant it answers —
//! acquire and renew, on both backends — so that a protected resource can tell which lock a token
//! was granted on, offline. The key comes from the environment or a file (never a flag); without one
//! lock-server answers without `grant` and says so at start-up.

use dlock_grant::{Claims, SigningKey};
use uuid::Uuid;

pub use dlock_common::grant::SIGNING_KEY_ENV;

/// The key and the lock service id every grant names. `Debug` redacts the key.
#[derive(Debug, Clone)]
pub struct Signer {
    pub lock_service: String,
    pub key: SigningKey,
}

impl Signer {
    pub fn new(lock_service: impl Into<String>, key: SigningKey) -> Self {
        Self {
            lock_service: lock_service.into(),
            key,
        }
    }

    /// The grant of `token` on `lock_key` to `owner_id` in `session_id`, signed. Every field was
    /// validated (or read back from the store) before, so the only failure is a bug.
    pub fn sign(
        &self,
        lock_key: &str,
        token: i64,
        owner_id: &str,
        session_id: Uuid,
    ) -> Result<String, dlock_grant::SignError> {
        self.key.sign(&Claims {
            lock_service: &self.lock_service,
            lock_key,
            token,
            owner_id,
            session_id,
        })
    }
}
