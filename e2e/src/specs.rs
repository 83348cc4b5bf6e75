//! The objects the tests create, built from the operator's own CRD types (so a test cannot write a
//! field the operator does not know) and k8s-openapi's.

use std::collections::BTreeMap;

use dlock_operator::crd::{
    Backend, DatabaseSpec, EtcdSpec, KillSwitches, LeaseSpec, LocalObjectRef, LockServerSpec, LockService,
    LockServiceSpec, PaymentStack, PaymentStackSpec, PayoutExecutorSpec, RailProxySpec, RailStubSpec,
    WorkloadSpec,
};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// A LockService with backend postgres over `database`, lock-server at `replicas`.
pub fn lockservice(name: &str, database: DatabaseSpec, replicas: i32) -> LockService {
    LockService::new(
        name,
        LockServiceSpec {
            database: Some(database),
            etcd: None,
            lock_server: LockServerSpec {
                replicas,
                ..LockServerSpec::default()
            },
            lease: LeaseSpec::default(),
            backend: Backend::Postgres,
            migration_image: None,
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
                ..LockServerSpec::default()
            },
            lease: LeaseSpec::default(),
            backend: Backend::Etcd,
            migration_image: None,
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
