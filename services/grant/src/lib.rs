//! Signed grants: what lets a protected resource tell *which lock* a fencing token was granted on,
//! offline, with no round trip to the lock service.
//!
//! lock-server signs each grant it hands out — lock service id, signing key id, lock key, fencing
//! token, owner id, session id — with an Ed25519 key only it holds ([`SigningKey`]). A resource
//! holds the public keys ([`PublicKeys`]) and accepts a token only inside a grant that verifies
//! under one of them, for the very resource it protects (docs/security.md, "Signed grants").
//!
//! - [`Grant`]: the signed fields, and their versioned binary form ([`Grant::encode`],
//!   [`Grant::decode`], parsed strictly: exact lengths, no trailing bytes, bounded fields);
//! - the wire form of a signed grant: `base64url(payload) "." base64url(signature)`, unpadded,
//!   canonical ([`SigningKey::sign`], [`PublicKeys::verify`]); the signature covers a fixed context
//!   string followed by the payload, so the key can sign nothing else that would pass for a grant;
//! - keys as text: `<keyId>=<base64url of 32 bytes>` for a private key (its seed) and for a public
//!   key; a set of public keys is such entries separated by commas (or white space).
//!
//! Verification is `verify_strict` (no small-order keys, canonical signatures). A private key's
//! `Debug` never shows it, and the key material is zeroized on drop.

use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ed25519_dalek::{Signature, Signer, VerifyingKey};
use rand::Rng;
use uuid::Uuid;

/// The version byte the payload starts with. A grant of any other version is malformed.
pub const PAYLOAD_VERSION: u8 = 1;
/// What the signature covers before the payload: a grant signature can never be mistaken for a
/// signature over anything else this key might ever sign.
const SIGNING_CONTEXT: &[u8] = b"dlock-grant/v1\0";

/// Bounds of the signed fields, in bytes (UTF-8). Lock keys are at most 256 characters and owner
/// ids at most 128 (lock-server validates both), so 4 bytes per character bounds them.
pub const MAX_LOCK_SERVICE_BYTES: usize = 253;
pub const MAX_KEY_ID_BYTES: usize = 32;
pub const MAX_LOCK_KEY_BYTES: usize = 1024;
pub const MAX_OWNER_ID_BYTES: usize = 512;
/// Longest wire form a verifier looks at; anything longer is malformed before any decoding.
pub const MAX_WIRE_LEN: usize = 4096;

const SIGNATURE_LEN: usize = 64;
const KEY_LEN: usize = 32;

/// Why a presented grant was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrantError {
    /// Not a grant: bad wire form, bad encoding, wrong version, a field out of bounds.
    #[error("the grant is malformed: {0}")]
    Malformed(String),
    /// Well-formed, but signed with a key id the verifier does not trust.
    #[error("the grant is signed with key {0:?}, which is not among the trusted public keys")]
    UnknownSigner(String),
    /// Signed with a trusted key id, but the signature does not verify (forged or altered).
    #[error("the grant's signature does not verify under key {0:?}")]
    BadSignature(String),
}

/// Why a key (or a key set) given as text was refused. Never contains key material.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("{what}: expected <keyId>=<base64url of 32 bytes>, with a key id of 1..=32 of [A-Za-z0-9._-]")]
    Format { what: &'static str },
    #[error("{what}: key id {id:?} appears twice")]
    Duplicate { what: &'static str, id: String },
    #[error("{what}: key {id:?} is not a usable Ed25519 public key")]
    Unusable { what: &'static str, id: String },
    #[error("{what}: no key given")]
    Empty { what: &'static str },
}

/// Why a grant could not be signed: a field out of the bounds the payload can carry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot sign a grant: {0}")]
pub struct SignError(String);

/// The name of a signing key, carried in every grant it signs so that a verifier knows which public
/// key to check it with: 1..=32 of `[A-Za-z0-9._-]`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KeyId(String);

impl KeyId {
    pub fn new(id: &str) -> Option<KeyId> {
        let ok = (1..=MAX_KEY_ID_BYTES).contains(&id.len())
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        ok.then(|| KeyId(id.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The fields a grant states, as signed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// Which lock service issued it (lock-server's `--lock-service-id`).
    pub lock_service: String,
    /// Which of its keys signed it.
    pub key_id: KeyId,
    /// The lock key it was granted on, e.g. `account:<uuid>`.
    pub lock_key: String,
    /// The fencing token of the grant (> 0).
    pub token: i64,
    pub owner_id: String,
    pub session_id: Uuid,
}

/// What the lock service signs: a [`Grant`] without the key id, which the signing key adds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claims<'a> {
    pub lock_service: &'a str,
    pub lock_key: &'a str,
    pub token: i64,
    pub owner_id: &'a str,
    pub session_id: Uuid,
}

impl Grant {
    /// The binary payload: the version byte, then each text field as a big-endian `u16` length and
    /// its UTF-8 bytes (lock service, key id, lock key), the token as a big-endian `i64`, the owner
    /// id likewise, and the session id's 16 bytes.
    pub fn encode(&self) -> Result<Vec<u8>, SignError> {
        let mut out = Vec::with_capacity(
            1 + 2 * 4 + 8 + 16 + self.lock_service.len() + self.lock_key.len() + self.owner_id.len() + 32,
        );
        out.push(PAYLOAD_VERSION);
        text(
            &mut out,
            "lock service id",
            &self.lock_service,
            MAX_LOCK_SERVICE_BYTES,
        )?;
        text(&mut out, "key id", self.key_id.as_str(), MAX_KEY_ID_BYTES)?;
        text(&mut out, "lock key", &self.lock_key, MAX_LOCK_KEY_BYTES)?;
        if self.token <= 0 {
            return Err(SignError(format!("the token must be > 0, got {}", self.token)));
        }
        out.extend_from_slice(&self.token.to_be_bytes());
        text(&mut out, "owner id", &self.owner_id, MAX_OWNER_ID_BYTES)?;
        out.extend_from_slice(self.session_id.as_bytes());
        Ok(out)
    }

    /// The inverse of [`Grant::encode`], strictly: the version must be [`PAYLOAD_VERSION`], every
    /// field within its bounds, non-empty and valid UTF-8, the token > 0, and nothing may follow.
    pub fn decode(bytes: &[u8]) -> Result<Grant, GrantError> {
        let mut r = Reader { rest: bytes };
        let version = r.take(1, "version")?[0];
        if version != PAYLOAD_VERSION {
            return Err(malformed(format!("unknown payload version {version}")));
        }
        let lock_service = r.text("lock service id", MAX_LOCK_SERVICE_BYTES)?;
        let key_id = r.text("key id", MAX_KEY_ID_BYTES)?;
        let key_id = KeyId::new(&key_id)
            .ok_or_else(|| malformed("the key id has a character outside [A-Za-z0-9._-]"))?;
        let lock_key = r.text("lock key", MAX_LOCK_KEY_BYTES)?;
        let token = i64::from_be_bytes(r.array::<8>("token")?);
        if token <= 0 {
            return Err(malformed(format!("the token must be > 0, got {token}")));
        }
        let owner_id = r.text("owner id", MAX_OWNER_ID_BYTES)?;
        let session_id = Uuid::from_bytes(r.array::<16>("session id")?);
        if !r.rest.is_empty() {
            return Err(malformed(format!(
                "{} unexpected bytes after the session id",
                r.rest.len()
            )));
        }
        Ok(Grant {
            lock_service,
            key_id,
            lock_key,
            token,
            owner_id,
            session_id,
        })
    }
}

fn malformed(message: impl Into<String>) -> GrantError {
    GrantError::Malformed(message.into())
}

fn text(out: &mut Vec<u8>, what: &str, value: &str, max: usize) -> Result<(), SignError> {
    if value.is_empty() || value.len() > max {
        return Err(SignError(format!(
            "the {what} must be 1..={max} bytes, got {}",
            value.len()
        )));
    }
    // `max` is at most 1024, so the length fits a u16.
    out.extend_from_slice(&(value.len() as u16).to_be_bytes());
    out.extend_from_slice(value.as_bytes());
    Ok(())
}

struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], GrantError> {
        if self.rest.len() < n {
            return Err(malformed(format!("the payload ends inside the {what}")));
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GrantError> {
        let bytes = self.take(N, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    fn text(&mut self, what: &str, max: usize) -> Result<String, GrantError> {
        let len = usize::from(u16::from_be_bytes(self.array::<2>(what)?));
        if len == 0 || len > max {
            return Err(malformed(format!(
                "the {what} must be 1..={max} bytes, got {len}"
            )));
        }
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| malformed(format!("the {what} is not UTF-8")))
    }
}

/// Canonical unpadded base64url: anything that does not re-encode to itself is refused (no
/// padding, no trailing bits, nothing outside the alphabet).
fn decode_b64(text: &str, what: &str) -> Result<Vec<u8>, GrantError> {
    let bytes = URL_SAFE_NO_PAD
        .decode(text)
        .map_err(|_| malformed(format!("the {what} is not canonical unpadded base64url")))?;
    if URL_SAFE_NO_PAD.encode(&bytes) != text {
        return Err(malformed(format!(
            "the {what} is not canonical unpadded base64url"
        )));
    }
    Ok(bytes)
}

/// `<id>=<base64url of 32 bytes>`, the text form of both kinds of key.
fn parse_entry(entry: &str, what: &'static str) -> Result<(KeyId, [u8; KEY_LEN]), KeyError> {
    let format = || KeyError::Format { what };
    let (id, b64) = entry.split_once('=').ok_or_else(format)?;
    let id = KeyId::new(id).ok_or_else(format)?;
    let bytes = decode_b64(b64, "key").map_err(|_| format())?;
    let bytes: [u8; KEY_LEN] = bytes.try_into().map_err(|_| format())?;
    Ok((id, bytes))
}

/// lock-server's private signing key and its id. `Debug` redacts it; the key is zeroized on drop.
#[derive(Clone)]
pub struct SigningKey {
    id: KeyId,
    key: ed25519_dalek::SigningKey,
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SigningKey")
            .field("id", &self.id)
            .field("key", &"<redacted>")
            .finish()
    }
}

impl SigningKey {
    /// A fresh key from the thread's cryptographically secure generator (ChaCha, seeded from the
    /// operating system).
    pub fn generate(id: KeyId) -> SigningKey {
        let mut seed = [0u8; KEY_LEN];
        rand::rng().fill(&mut seed);
        let key = ed25519_dalek::SigningKey::from_bytes(&seed);
        seed.fill(0);
        SigningKey { id, key }
    }

    /// `<keyId>=<base64url of the 32-byte seed>`, surrounding white space ignored (a file's newline).
    /// The error never repeats the text.
    pub fn parse(text: &str) -> Result<SigningKey, KeyError> {
        let (id, mut seed) = parse_entry(text.trim(), "signing key")?;
        let key = ed25519_dalek::SigningKey::from_bytes(&seed);
        seed.fill(0);
        Ok(SigningKey { id, key })
    }

    /// The private key as [`SigningKey::parse`] reads it. Secret: only for writing it where it is
    /// kept (a Secret, the environment of the one process that signs).
    pub fn expose_text(&self) -> String {
        format!("{}={}", self.id, URL_SAFE_NO_PAD.encode(self.key.to_bytes()))
    }

    pub fn id(&self) -> &KeyId {
        &self.id
    }

    pub fn public_key(&self) -> PublicKey {
        PublicKey {
            id: self.id.clone(),
            key: self.key.verifying_key(),
        }
    }

    /// Signs `claims` with this key; the wire form of the signed grant.
    pub fn sign(&self, claims: &Claims<'_>) -> Result<String, SignError> {
        let grant = Grant {
            lock_service: claims.lock_service.to_owned(),
            key_id: self.id.clone(),
            lock_key: claims.lock_key.to_owned(),
            token: claims.token,
            owner_id: claims.owner_id.to_owned(),
            session_id: claims.session_id,
        };
        let payload = grant.encode()?;
        let signature = self.key.sign(&signed_message(&payload));
        Ok(format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(&payload),
            URL_SAFE_NO_PAD.encode(signature.to_bytes())
        ))
    }
}

fn signed_message(payload: &[u8]) -> Vec<u8> {
    let mut message = Vec::with_capacity(SIGNING_CONTEXT.len() + payload.len());
    message.extend_from_slice(SIGNING_CONTEXT);
    message.extend_from_slice(payload);
    message
}

/// One trusted public key and its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicKey {
    id: KeyId,
    key: VerifyingKey,
}

impl PublicKey {
    pub fn id(&self) -> &KeyId {
        &self.id
    }

    /// `<keyId>=<base64url of the 32-byte key>`.
    pub fn to_text(&self) -> String {
        format!("{}={}", self.id, URL_SAFE_NO_PAD.encode(self.key.as_bytes()))
    }

    fn parse(entry: &str) -> Result<PublicKey, KeyError> {
        let what = "public keys";
        let (id, bytes) = parse_entry(entry, what)?;
        let unusable = || KeyError::Unusable {
            what,
            id: id.to_string(),
        };
        let key = VerifyingKey::from_bytes(&bytes).map_err(|_| unusable())?;
        // A small-order key verifies signatures it never made.
        if key.is_weak() {
            return Err(unusable());
        }
        Ok(PublicKey { id, key })
    }
}

/// The public keys a resource trusts: every grant signed by one of them (and by nothing else) is
/// accepted as authentic. Several keys during a rotation (docs/operations.md).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PublicKeys {
    keys: Vec<PublicKey>,
}

impl PublicKeys {
    pub fn new(keys: Vec<PublicKey>) -> Result<PublicKeys, KeyError> {
        let mut out = PublicKeys::default();
        for key in keys {
            out = out.with(key)?;
        }
        Ok(out)
    }

    /// Adds a key; an id already present is an error (two keys of one name would make a grant's key
    /// id ambiguous).
    pub fn with(mut self, key: PublicKey) -> Result<PublicKeys, KeyError> {
        if self.get(key.id()).is_some() {
            return Err(KeyError::Duplicate {
                what: "public keys",
                id: key.id.to_string(),
            });
        }
        self.keys.push(key);
        Ok(self)
    }

    /// `<id>=<key>` entries separated by commas and/or white space (one per line in a file works
    /// too). Empty text is an empty set; whether that is acceptable is the caller's decision.
    pub fn parse(text: &str) -> Result<PublicKeys, KeyError> {
        let entries = text
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|e| !e.is_empty());
        let mut out = PublicKeys::default();
        for entry in entries {
            out = out.with(PublicKey::parse(entry)?)?;
        }
        Ok(out)
    }

    /// The set as [`PublicKeys::parse`] reads it: entries joined by commas, in the order given.
    pub fn to_text(&self) -> String {
        self.keys
            .iter()
            .map(PublicKey::to_text)
            .collect::<Vec<_>>()
            .join(",")
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn ids(&self) -> impl Iterator<Item = &KeyId> {
        self.keys.iter().map(PublicKey::id)
    }

    pub fn iter(&self) -> impl Iterator<Item = &PublicKey> {
        self.keys.iter()
    }

    pub fn get(&self, id: &KeyId) -> Option<&PublicKey> {
        self.keys.iter().find(|k| &k.id == id)
    }

    /// Checks a grant in its wire form: well-formed, signed by a key of this set, the signature
    /// valid (strictly). Returns what it states; whether that fits the request is the caller's
    /// question (the token presented, the resource written).
    pub fn verify(&self, wire: &str) -> Result<Grant, GrantError> {
        if wire.len() > MAX_WIRE_LEN {
            return Err(malformed(format!("longer than {MAX_WIRE_LEN} characters")));
        }
        let (payload, signature) = wire
            .split_once('.')
            .ok_or_else(|| malformed("expected <payload>.<signature>"))?;
        if payload.is_empty() || signature.is_empty() || signature.contains('.') {
            return Err(malformed("expected <payload>.<signature>"));
        }
        let payload = decode_b64(payload, "payload")?;
        let signature = decode_b64(signature, "signature")?;
        let signature: [u8; SIGNATURE_LEN] = signature
            .try_into()
            .map_err(|_| malformed(format!("the signature must be {SIGNATURE_LEN} bytes")))?;
        let grant = Grant::decode(&payload)?;
        let key = self
            .get(&grant.key_id)
            .ok_or_else(|| GrantError::UnknownSigner(grant.key_id.to_string()))?;
        key.key
            .verify_strict(&signed_message(&payload), &Signature::from_bytes(&signature))
            .map_err(|_| GrantError::BadSignature(grant.key_id.to_string()))?;
        Ok(grant)
    }
}

#[cfg(test)]
mod tests;
