//! Every reason the operator writes into a condition or an Event: one enum, so a reason cannot be
//! misspelt in one place, and `docs/operations.md` can list them all from here.

use std::fmt;

/// CamelCase reasons of conditions and Events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    // The verdict (Ready / Progressing / Degraded conditions).
    Ready,
    Idle,
    AsExpected,
    RollingOut,
    Migrating,
    MigrationFailed,
    WaitingForDatabase,
    WaitingForEtcd,
    WaitingForLockService,
    LockServiceNotFound,
    LockTrafficGated,
    InvalidSpec,
    CredentialsInvalid,
    ExternalSecretMissing,
    ExternalSecretInvalid,
    ExternalUrlInvalid,
    EtcdEndpointsInvalid,
    DatabaseEngineMissing,
    WaitingForDatabaseInstances,
    // What the reconciler did (Events).
    CredentialsCreated,
    MigrationStarted,
    StaleMigrationJobDeleted,
    ChildDeleted,
    EtcdMembersReady,
    DatabaseFailover,
    DatabaseSwitchover,
    DatabaseInstancesReady,
    InvalidObject,
    ReconcileFailed,
    // The actions, the periodic fencing check and lock-server's sequence jumps.
    ActionRequestInvalid,
    FencingSequenceBehind,
    FencingSequenceCaughtUp,
    SequenceJumped,
    RevokeWaiting,
    RevokeTargetRecorded,
    RevokeSucceeded,
    RevokeFailed,
    RestoreGateClosing,
    RestoreGateClosed,
    RestoreHighWaterRead,
    RestoreSequenceAdvanced,
    RestoreSucceeded,
    RestoreFailed,
    RestoreUnsupported,
    // Signed grants: the keys of a LockService.
    GrantKeysInvalid,
    GrantKeysCreated,
    GrantKeyAdded,
    GrantKeyRetired,
    GrantKeyRequestRefused,
    GrantSigningKeySwitched,
    // Lock clients: lock-server's clients file.
    LockClientsInvalid,
    LockClientsChanged,
    // HTTPS: the namespace's CA and the components' certificates.
    TlsCaInvalid,
    CaCreated,
    CaRotationStarted,
    CaRotated,
    CertificateIssued,
    CertificateRenewed,
    RenewRequestInvalid,
}

impl Reason {
    pub const ALL: [Reason; 59] = [
        Reason::Ready,
        Reason::Idle,
        Reason::AsExpected,
        Reason::RollingOut,
        Reason::Migrating,
        Reason::MigrationFailed,
        Reason::WaitingForDatabase,
        Reason::WaitingForEtcd,
        Reason::WaitingForLockService,
        Reason::LockServiceNotFound,
        Reason::LockTrafficGated,
        Reason::InvalidSpec,
        Reason::CredentialsInvalid,
        Reason::ExternalSecretMissing,
        Reason::ExternalSecretInvalid,
        Reason::ExternalUrlInvalid,
        Reason::EtcdEndpointsInvalid,
        Reason::DatabaseEngineMissing,
        Reason::WaitingForDatabaseInstances,
        Reason::CredentialsCreated,
        Reason::MigrationStarted,
        Reason::StaleMigrationJobDeleted,
        Reason::ChildDeleted,
        Reason::EtcdMembersReady,
        Reason::DatabaseFailover,
        Reason::DatabaseSwitchover,
        Reason::DatabaseInstancesReady,
        Reason::InvalidObject,
        Reason::ReconcileFailed,
        Reason::ActionRequestInvalid,
        Reason::FencingSequenceBehind,
        Reason::FencingSequenceCaughtUp,
        Reason::SequenceJumped,
        Reason::RevokeWaiting,
        Reason::RevokeTargetRecorded,
        Reason::RevokeSucceeded,
        Reason::RevokeFailed,
        Reason::RestoreGateClosing,
        Reason::RestoreGateClosed,
        Reason::RestoreHighWaterRead,
        Reason::RestoreSequenceAdvanced,
        Reason::RestoreSucceeded,
        Reason::RestoreFailed,
        Reason::RestoreUnsupported,
        Reason::GrantKeysInvalid,
        Reason::GrantKeysCreated,
        Reason::GrantKeyAdded,
        Reason::GrantKeyRetired,
        Reason::GrantKeyRequestRefused,
        Reason::GrantSigningKeySwitched,
        Reason::LockClientsInvalid,
        Reason::LockClientsChanged,
        Reason::TlsCaInvalid,
        Reason::CaCreated,
        Reason::CaRotationStarted,
        Reason::CaRotated,
        Reason::CertificateIssued,
        Reason::CertificateRenewed,
        Reason::RenewRequestInvalid,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Ready => "Ready",
            Reason::Idle => "Idle",
            Reason::AsExpected => "AsExpected",
            Reason::RollingOut => "RollingOut",
            Reason::Migrating => "Migrating",
            Reason::MigrationFailed => "MigrationFailed",
            Reason::WaitingForDatabase => "WaitingForDatabase",
            Reason::WaitingForEtcd => "WaitingForEtcd",
            Reason::WaitingForLockService => "WaitingForLockService",
            Reason::LockServiceNotFound => "LockServiceNotFound",
            Reason::LockTrafficGated => "LockTrafficGated",
            Reason::InvalidSpec => "InvalidSpec",
            Reason::CredentialsInvalid => "CredentialsInvalid",
            Reason::ExternalSecretMissing => "ExternalSecretMissing",
            Reason::ExternalSecretInvalid => "ExternalSecretInvalid",
            Reason::ExternalUrlInvalid => "ExternalUrlInvalid",
            Reason::EtcdEndpointsInvalid => "EtcdEndpointsInvalid",
            Reason::DatabaseEngineMissing => "DatabaseEngineMissing",
            Reason::WaitingForDatabaseInstances => "WaitingForDatabaseInstances",
            Reason::CredentialsCreated => "CredentialsCreated",
            Reason::MigrationStarted => "MigrationStarted",
            Reason::StaleMigrationJobDeleted => "StaleMigrationJobDeleted",
            Reason::ChildDeleted => "ChildDeleted",
            Reason::EtcdMembersReady => "EtcdMembersReady",
            Reason::DatabaseFailover => "DatabaseFailover",
            Reason::DatabaseSwitchover => "DatabaseSwitchover",
            Reason::DatabaseInstancesReady => "DatabaseInstancesReady",
            Reason::InvalidObject => "InvalidObject",
            Reason::ReconcileFailed => "ReconcileFailed",
            Reason::ActionRequestInvalid => "ActionRequestInvalid",
            Reason::FencingSequenceBehind => "FencingSequenceBehind",
            Reason::FencingSequenceCaughtUp => "FencingSequenceCaughtUp",
            Reason::SequenceJumped => "SequenceJumped",
            Reason::RevokeWaiting => "RevokeWaiting",
            Reason::RevokeTargetRecorded => "RevokeTargetRecorded",
            Reason::RevokeSucceeded => "RevokeSucceeded",
            Reason::RevokeFailed => "RevokeFailed",
            Reason::RestoreGateClosing => "RestoreGateClosing",
            Reason::RestoreGateClosed => "RestoreGateClosed",
            Reason::RestoreHighWaterRead => "RestoreHighWaterRead",
            Reason::RestoreSequenceAdvanced => "RestoreSequenceAdvanced",
            Reason::RestoreSucceeded => "RestoreSucceeded",
            Reason::RestoreFailed => "RestoreFailed",
            Reason::RestoreUnsupported => "RestoreUnsupported",
            Reason::GrantKeysInvalid => "GrantKeysInvalid",
            Reason::GrantKeysCreated => "GrantKeysCreated",
            Reason::GrantKeyAdded => "GrantKeyAdded",
            Reason::GrantKeyRetired => "GrantKeyRetired",
            Reason::GrantKeyRequestRefused => "GrantKeyRequestRefused",
            Reason::GrantSigningKeySwitched => "GrantSigningKeySwitched",
            Reason::LockClientsInvalid => "LockClientsInvalid",
            Reason::LockClientsChanged => "LockClientsChanged",
            Reason::TlsCaInvalid => "TlsCaInvalid",
            Reason::CaCreated => "CaCreated",
            Reason::CaRotationStarted => "CaRotationStarted",
            Reason::CaRotated => "CaRotated",
            Reason::CertificateIssued => "CertificateIssued",
            Reason::CertificateRenewed => "CertificateRenewed",
            Reason::RenewRequestInvalid => "RenewRequestInvalid",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An Event a step asks for: its reason, whether it is a Warning, and its note.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventNote {
    pub reason: Reason,
    pub warning: bool,
    pub note: String,
}

#[cfg(test)]
mod tests {
    use super::Reason;

    #[test]
    fn reasons_are_unique_camel_case_and_match_their_variant() {
        let mut seen = std::collections::HashSet::new();
        for r in Reason::ALL {
            let s = r.as_str();
            assert!(seen.insert(s), "{s} twice");
            assert!(s.chars().next().is_some_and(|c| c.is_ascii_uppercase()), "{s}");
            assert!(s.chars().all(|c| c.is_ascii_alphanumeric()), "{s}");
            assert_eq!(format!("{r:?}"), s, "the string is the variant's name");
        }
    }

    #[test]
    fn every_reason_is_documented_in_the_runbook() {
        let doc = include_str!("../../docs/operations.md");
        let missing: Vec<&str> = Reason::ALL
            .iter()
            .map(|r| r.as_str())
            .filter(|s| !doc.contains(&format!("`{s}`")))
            .collect();
        assert!(missing.is_empty(), "docs/operations.md does not name {missing:?}");
    }
}
