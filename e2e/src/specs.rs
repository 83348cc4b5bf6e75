//! The objects the tests create, built from the operator's own CRD types (so a test cannot write a
//! field the operator does not know) and k8s-openapi's.

use std::collections::BTreeMap;

use dlock_operator::crd::{
    Backend, ClientsSecretRef, DatabaseSpec, EtcdSpec, KillSwitches, LeaseSpec, LocalObjectRef,
    LockServerSpec, LockService, LockServiceSpec, PaymentStack, PaymentStackSpec, PayoutExecutorSpec,
    RailProxySpec, RailStubSpec, TlsMode, TlsSpec, WorkloadSpec,
};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// `spec.tls` of the cluster tier's objects: plain HTTP, because its stand-in kubelet
/// (`crate::kubelet`) runs each pod's process with the pod's env but mounts no volume, and its proxy
/// forwards plain HTTP only. HTTPS between the pods is the kind tier's (every object there takes the
/// default, `Operator`).
pub fn tls_disabled() -> TlsSpec {
    TlsSpec {
        mode: TlsMode::Disabled,
    }
}

/// `spec.lockServer.clientsSecretRef` of the tests' LockServices: the tests' own lock client
/// ([`crate::lockapi::test_clients_file`]), beside the stacks' clients the operator adds.
pub fn test_clients_ref() -> ClientsSecretRef {
    ClientsSecretRef {
        name: crate::lockapi::TEST_CLIENTS_SECRET.into(),
        key: "clients.json".into(),
    }
}

/// The Secret [`test_clients_ref`] names, to create in each test's namespace.
pub fn test_clients_secret() -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(crate::lockapi::TEST_CLIENTS_SECRET.into()),
            ..ObjectMeta::default()
        },
        string_data: Some(BTreeMap::from([(
            "clients.json".to_owned(),
            crate::lockapi::test_clients_file(),
        )])),
        ..Secret::default()
    }
}

/// A LockService with backend postgres over `database`, lock-server at `replicas`.
pub fn lockservice(name: &str, database: DatabaseSpec, replicas: i32) -> LockService {
    LockService::new(
        name,
        LockServiceSpec {
            database: Some(database),
            etcd: None,
            lock_server: LockServerSpec {
                replicas,
                clients_secret_ref: Some(test_clients_ref()),
                ..LockServerSpec::default()
            },
            lease: LeaseSpec::default(),
            backend: Backend::Postgres,
            migration_image: None,
            tls: tls_disabled(),
        },
    )
}

/// A LockService with backend etcd over `etcd`, lock-server at `replicas`.
pub fn etcd_lockservice(name: &str, etcd: EtcdSpec, replicas: i32) -> LockService {
    LockService::new(
        name,
        LockServiceSpec {
            database: None,
            etcd: Some(etcd),
            lock_server: LockServerSpec {
                replicas,
                clients_secret_ref: Some(test_clients_ref()),
                ..LockServerSpec::default()
            },
            lease: LeaseSpec::default(),
            backend: Backend::Etcd,
            migration_image: None,
            tls: tls_disabled(),
        },
    )
}

/// A PaymentStack fenced by LockService `lsvc`: a managed paydb, the rail-stub as its rail, every
/// workload at its defaults.
pub fn stack_spec(lsvc: &str) -> PaymentStackSpec {
    PaymentStackSpec {
        lock_service_ref: LocalObjectRef {
            name: lsvc.to_owned(),
        },
        database: DatabaseSpec::managed(),
        payment_resource: WorkloadSpec::default(),
        rail_proxy: RailProxySpec::default(),
        payout_executor: PayoutExecutorSpec::default(),
        rail_stub: RailStubSpec {
            enabled: true,
            ..RailStubSpec::default()
        },
        kill_switches: KillSwitches::default(),
        migration_image: None,
        demo_data: false,
        tls: tls_disabled(),
    }
}

pub fn paymentstack(name: &str, spec: PaymentStackSpec) -> PaymentStack {
    PaymentStack::new(name, spec)
}

/// A Secret holding one key, written as `stringData` (as the samples and the docs write them).
pub fn secret(name: &str, key: &str, value: &str) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        string_data: Some(BTreeMap::from([(key.to_owned(), value.to_owned())])),
        ..Secret::default()
    }
}
