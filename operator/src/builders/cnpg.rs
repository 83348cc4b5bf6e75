//! A managed database on CloudNativePG (`database.managed.engine: CloudNativePG`): the operator
//! writes one `postgresql.cnpg.io/v1` `Cluster` and reads its status; CloudNativePG runs the
//! instances, streaming replication, synchronous commit, failover and switchover. No failover logic
//! lives here — what dlock adds on top is lock-server's sequence jump on every new timeline
//! (docs/design.md, "Never a reused token").
//!
//! The Cluster keeps the names the StatefulSet engine uses: it is called `<owner>-<db>` like the
//! StatefulSet, its superuser password is the credentials Secret's `postgres-password` (handed to
//! CloudNativePG in a `kubernetes.io/basic-auth` Secret, the shape it reads), and the services reach
//! the primary through the Service CloudNativePG keeps pointed at it, `<cluster>-rw`.
//!
//! Only the fields dlock sets are typed here (the schema is CloudNativePG's): server-side apply
//! then owns exactly these, and CloudNativePG's defaults fill in the rest.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ResourceRequirements, Secret};
use kube::CustomResource;
use serde::{Deserialize, Serialize};

use super::Owner;
use super::postgres::{Credentials, History, names};
use crate::crd::status::{DatabaseStatus, PrimaryChange};
use crate::crd::{DataDurability, ManagedDatabase};

/// The API group CloudNativePG serves its Cluster from (checked at start-up: without it the
/// operator does not watch Clusters, and a spec asking for the engine is reported, not applied).
pub const GROUP: &str = "postgresql.cnpg.io";

/// The role CloudNativePG's initdb makes the database's owner. dlock never logs in as it: the
/// migrations run as the superuser, as with the StatefulSet engine, and create the application role.
fn initdb_owner(history: History) -> String {
    format!("{}_owner", history.name())
}

/// The subset of CloudNativePG's `Cluster` spec that dlock writes.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "postgresql.cnpg.io",
    version = "v1",
    kind = "Cluster",
    namespaced,
    status = "ClusterStatus",
    schema = "disabled",
    derive = "PartialEq"
)]
// Read back from the API server too: absent fields (CloudNativePG's own defaults) are not errors.
#[serde(rename_all = "camelCase", default)]
pub struct ClusterSpec {
    pub instances: i32,
    pub image_name: String,
    /// `IfNotPresent`: images may be loaded into the nodes rather than pulled (kind, air-gapped).
    pub image_pull_policy: String,
    pub postgresql: PostgresConfiguration,
    pub bootstrap: Bootstrap,
    pub enable_superuser_access: bool,
    pub superuser_secret: LocalObjectReference,
    pub storage: Storage,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct PostgresConfiguration {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub synchronous: Option<SynchronousReplication>,
    /// Rules before CloudNativePG's own (its replication rules need TLS already).
    #[serde(default, rename = "pg_hba", skip_serializing_if = "Vec::is_empty")]
    pub pg_hba: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct SynchronousReplication {
    /// `any`: a quorum of `number` among the standbys (ANY n in synchronous_standby_names).
    pub method: String,
    pub number: i32,
    /// `required` or `preferred`.
    pub data_durability: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct Bootstrap {
    pub initdb: InitDb,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct InitDb {
    pub database: String,
    pub owner: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct LocalObjectReference {
    pub name: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct Storage {
    pub size: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class: Option<String>,
}

/// What dlock reads of a Cluster's status (CloudNativePG writes many more fields).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStatus {
    #[serde(default)]
    pub instances: Option<i32>,
    #[serde(default)]
    pub ready_instances: Option<i32>,
    #[serde(default)]
    pub current_primary: Option<String>,
    /// The instance CloudNativePG is promoting (failover) or switching over to.
    #[serde(default)]
    pub target_primary: Option<String>,
    #[serde(default, rename = "timelineID")]
    pub timeline_id: Option<i64>,
    /// e.g. "Cluster in healthy state", "Failing over", "Switchover in progress".
    #[serde(default)]
    pub phase: Option<String>,
    #[serde(default)]
    pub phase_reason: Option<String>,
}

/// The basic-auth Secret CloudNativePG sets the superuser's password from.
pub fn superuser_secret_name(owner: &Owner, history: History) -> String {
    owner.child(&format!("{}-superuser", history.name()))
}

/// The superuser's credentials in the shape CloudNativePG reads. `None` without a superuser
/// password (external mode has none; the caller only asks for managed databases).
pub fn superuser_secret(owner: &Owner, history: History, credentials: &Credentials) -> Option<Secret> {
    let password = credentials.postgres_password.as_ref()?;
    Some(Secret {
        metadata: owner.meta(superuser_secret_name(owner, history), history.name()),
        type_: Some("kubernetes.io/basic-auth".into()),
        data: Some(BTreeMap::from([
            ("username".to_owned(), ByteString(b"postgres".to_vec())),
            ("password".to_owned(), ByteString(password.clone().into_bytes())),
        ])),
        ..Secret::default()
    })
}

/// The Cluster for one managed database.
pub fn cluster(owner: &Owner, history: History, spec: &ManagedDatabase) -> Cluster {
    let synchronous = spec.synchronous.as_ref().map(|s| SynchronousReplication {
        method: "any".into(),
        number: s.number,
        data_durability: match s.data_durability {
            DataDurability::Required => "required",
            DataDurability::Preferred => "preferred",
        }
        .into(),
    });
    let mut c = Cluster::new(
        &names(owner, history).server,
        ClusterSpec {
            instances: spec.instances,
            image_name: spec.image.clone(),
            image_pull_policy: "IfNotPresent".into(),
            postgresql: PostgresConfiguration {
                synchronous,
                // TLS or nothing: every dlock URL of this database says verify-full, and a
                // connection without TLS would carry the password and the tokens in clear.
                pg_hba: vec!["hostnossl all all all reject".into()],
            },
            bootstrap: Bootstrap {
                initdb: InitDb {
                    database: history.name().into(),
                    owner: initdb_owner(history),
                },
            },
            enable_superuser_access: true,
            superuser_secret: LocalObjectReference {
                name: superuser_secret_name(owner, history),
            },
            storage: Storage {
                size: spec.storage_size.clone(),
                storage_class: spec.storage_class_name.clone(),
            },
            resources: spec.resources.clone(),
        },
    );
    c.metadata = owner.meta(names(owner, history).server, history.name());
    c
}

/// A Cluster as dlock reports it (status.database) and gates on.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClusterHealth {
    /// The Cluster's name.
    pub name: String,
    /// Instances the spec asks for.
    pub instances: i32,
    pub ready: i32,
    pub primary: Option<String>,
    pub target_primary: Option<String>,
    pub timeline: Option<i64>,
    pub phase: Option<String>,
    /// `any N (required)`, or `None` for asynchronous replication.
    pub synchronous: Option<String>,
    /// The last promotion CloudNativePG was seen running, from the operator's watch of the
    /// Cluster (every change, not one look per reconcile); `None` until one was seen.
    pub promotion: Option<Promotion>,
}

/// A promotion CloudNativePG ran: its kind, told by its phase while it ran, and the primary it
/// went from and to. Its phase lasts seconds; a reconcile can miss it, the watch cannot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Promotion {
    pub switchover: bool,
    pub from: String,
    pub to: String,
}

impl Promotion {
    /// The promotion a Cluster's status shows under way, if any.
    pub fn under_way(status: &ClusterStatus) -> Option<Promotion> {
        let switchover = match status.phase.as_deref()? {
            PHASE_SWITCHOVER => true,
            PHASE_FAILING_OVER => false,
            _ => return None,
        };
        let from = status.current_primary.clone().filter(|p| !p.is_empty())?;
        let to = status.target_primary.clone().filter(|p| !p.is_empty())?;
        (from != to).then_some(Promotion { switchover, from, to })
    }
}

/// CloudNativePG's phase while it promotes a standby after losing the primary.
pub const PHASE_FAILING_OVER: &str = "Failing over";
/// CloudNativePG's phase while a requested switchover is under way.
pub const PHASE_SWITCHOVER: &str = "Switchover in progress";

impl ClusterHealth {
    /// From the Cluster as read (`None`: not created yet).
    pub fn of(name: &str, spec: &ManagedDatabase, cluster: Option<&Cluster>) -> ClusterHealth {
        let status = cluster.and_then(|c| c.status.clone()).unwrap_or_default();
        ClusterHealth {
            name: name.to_owned(),
            instances: spec.instances,
            ready: status.ready_instances.unwrap_or(0),
            primary: status.current_primary.filter(|p| !p.is_empty()),
            target_primary: status.target_primary.filter(|p| !p.is_empty()),
            timeline: status.timeline_id,
            phase: status.phase.filter(|p| !p.is_empty()),
            synchronous: spec.synchronous.as_ref().map(|s| {
                let durability = match s.data_durability {
                    DataDurability::Required => "required",
                    DataDurability::Preferred => "preferred",
                };
                format!("any {} ({durability})", s.number)
            }),
            promotion: None,
        }
    }

    /// The migration and the services can start: there is a primary, and it is ready. (While
    /// CloudNativePG fails over, the `-rw` Service has no endpoint; the services already running
    /// retry on their own and are not restarted for it.)
    pub fn has_primary(&self) -> bool {
        self.primary.is_some() && self.ready >= 1
    }

    pub fn all_ready(&self) -> bool {
        self.ready >= self.instances
    }

    /// Synchronous `required` with fewer ready standbys than it needs: commits wait.
    pub fn commits_blocked(&self, spec: &ManagedDatabase) -> bool {
        spec.synchronous
            .as_ref()
            .is_some_and(|s| s.data_durability == DataDurability::Required && self.ready - 1 < s.number)
    }
}

impl ClusterHealth {
    /// `status.database`, carrying over the last change of primary, or recording a new one when
    /// the primary differs from the one `previous` showed. Pure: `now` is the reconcile's clock.
    pub fn status(&self, previous: Option<&DatabaseStatus>, now: &str) -> DatabaseStatus {
        let mut last = previous.and_then(|p| p.last_primary_change.clone());
        if let Some(change) = self.primary_change(previous, now) {
            last = Some(change);
        } else if let Some(l) = last
            .as_mut()
            .filter(|l| l.to.as_str() == self.primary.as_deref().unwrap_or_default())
            && self.timeline > l.timeline
        {
            // CloudNativePG may name the new primary before it reports the new timeline.
            l.timeline = self.timeline;
        }
        DatabaseStatus {
            cluster: self.name.clone(),
            primary: self.primary.clone(),
            ready: format!("{}/{}", self.ready, self.instances),
            instances: self.instances,
            ready_instances: self.ready,
            synchronous: self.synchronous.clone().unwrap_or_else(|| "async".into()),
            timeline: self.timeline,
            engine_phase: self.phase.clone(),
            last_primary_change: last,
        }
    }

    /// A new primary where `previous` showed another one. Its kind is the one of the promotion
    /// the watch saw from this primary to that one; without one (an operator started after it),
    /// a switchover when CloudNativePG's phase, now or at the last look, said one was under way,
    /// and a failover otherwise.
    pub fn primary_change(&self, previous: Option<&DatabaseStatus>, now: &str) -> Option<PrimaryChange> {
        let from = previous?.primary.clone()?;
        let to = self.primary.clone()?;
        if from == to {
            return None;
        }
        let watched = self
            .promotion
            .as_ref()
            .filter(|p| p.from == from && p.to == to)
            .map(|p| p.switchover);
        let switchover = watched.unwrap_or_else(|| {
            [
                self.phase.as_deref(),
                previous.and_then(|p| p.engine_phase.as_deref()),
            ]
            .into_iter()
            .flatten()
            .any(|p| p == PHASE_SWITCHOVER)
        });
        // The timeline once it is the promoted one's (above the one shown before); until then
        // unknown, and filled in by a later look ([`ClusterHealth::status`]).
        let timeline = self
            .timeline
            .filter(|t| previous.and_then(|p| p.timeline).is_none_or(|before| *t > before));
        Some(PrimaryChange {
            kind: if switchover { "Switchover" } else { "Failover" }.into(),
            from,
            to,
            seen_at: now.to_owned(),
            timeline,
        })
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    use super::*;
    use crate::crd::{DatabaseEngine, Synchronous};

    fn owner(kind: &str, name: &str) -> Owner {
        Owner {
            name: name.into(),
            namespace: "ns".into(),
            kind: kind.into(),
            owner_ref: OwnerReference {
                api_version: "dlock.dev/v1alpha1".into(),
                kind: kind.into(),
                name: name.into(),
                uid: "uid-1".into(),
                controller: Some(true),
                ..OwnerReference::default()
            },
            https: false,
        }
    }

    fn ha(instances: i32, sync: Option<Synchronous>) -> ManagedDatabase {
        ManagedDatabase {
            engine: DatabaseEngine::CloudNativePg,
            instances,
            synchronous: sync,
            image: "dlock-local/postgres:16.15".into(),
            ..ManagedDatabase::default()
        }
    }

    #[test]
    fn the_cluster_names_the_image_instances_synchronous_mode_and_the_superuser_secret() {
        let o = owner("LockService", "locks");
        let c = cluster(&o, History::Lockdb, &ha(3, Some(Synchronous::default())));
        assert_eq!(c.metadata.name.as_deref(), Some("locks-lockdb"));
        assert_eq!(c.metadata.owner_references.as_ref().map(Vec::len), Some(1));
        let v = serde_json::to_value(&c).expect("serialisable");
        assert_eq!(v["apiVersion"], "postgresql.cnpg.io/v1");
        assert_eq!(v["kind"], "Cluster");
        assert_eq!(v["spec"]["instances"], 3);
        assert_eq!(v["spec"]["imageName"], "dlock-local/postgres:16.15");
        assert_eq!(v["spec"]["imagePullPolicy"], "IfNotPresent");
        assert_eq!(
            v["spec"]["postgresql"]["synchronous"],
            serde_json::json!({"method": "any", "number": 1, "dataDurability": "required"})
        );
        assert_eq!(v["spec"]["bootstrap"]["initdb"]["database"], "lockdb");
        assert_eq!(
            v["spec"]["postgresql"]["pg_hba"],
            serde_json::json!(["hostnossl all all all reject"]),
            "no connection without TLS"
        );
        assert_eq!(v["spec"]["enableSuperuserAccess"], true);
        assert_eq!(v["spec"]["superuserSecret"]["name"], "locks-lockdb-superuser");
        assert_eq!(v["spec"]["storage"]["size"], "1Gi");
        // Fields dlock does not set are not sent, so server-side apply does not claim them.
        assert!(v["spec"].get("resources").is_none(), "{v}");
        assert!(v["spec"]["storage"].get("storageClass").is_none(), "{v}");
        assert!(v.get("status").is_none(), "{v}");
    }

    #[test]
    fn asynchronous_replication_sends_no_synchronous_block() {
        let o = owner("PaymentStack", "pay");
        let c = cluster(&o, History::Paydb, &ha(2, None));
        let v = serde_json::to_value(&c).expect("serialisable");
        assert!(v["spec"]["postgresql"].get("synchronous").is_none(), "{v}");
        assert_eq!(v["spec"]["bootstrap"]["initdb"]["database"], "paydb");
    }

    #[test]
    fn the_superuser_secret_is_basic_auth_with_the_generated_password() {
        let o = owner("LockService", "locks");
        let creds = Credentials {
            app_password: "a".into(),
            postgres_password: Some("s3cret".into()),
        };
        let s = superuser_secret(&o, History::Lockdb, &creds).expect("managed credentials");
        assert_eq!(s.type_.as_deref(), Some("kubernetes.io/basic-auth"));
        let data = s.data.expect("data");
        assert_eq!(data["username"].0, b"postgres");
        assert_eq!(data["password"].0, b"s3cret");
        let external = Credentials {
            app_password: "a".into(),
            postgres_password: None,
        };
        assert!(superuser_secret(&o, History::Lockdb, &external).is_none());
    }

    #[test]
    fn health_reads_the_status_cloudnativepg_writes() {
        let spec = ha(2, Some(Synchronous::default()));
        let raw = serde_json::json!({
            "apiVersion": "postgresql.cnpg.io/v1", "kind": "Cluster",
            "metadata": {"name": "locks-lockdb", "namespace": "ns"},
            "spec": {"instances": 2},
            "status": {"instances": 2, "readyInstances": 2, "currentPrimary": "locks-lockdb-1",
                       "targetPrimary": "locks-lockdb-1", "timelineID": 1,
                       "phase": "Cluster in healthy state", "instancesStatus": {"healthy": ["locks-lockdb-1"]}}
        });
        let c: Cluster = serde_json::from_value(raw).expect("a Cluster");
        let h = ClusterHealth::of("locks-lockdb", &spec, Some(&c));
        assert_eq!(h.primary.as_deref(), Some("locks-lockdb-1"));
        assert_eq!((h.ready, h.instances, h.timeline), (2, 2, Some(1)));
        assert_eq!(h.synchronous.as_deref(), Some("any 1 (required)"));
        assert!(h.has_primary() && h.all_ready() && !h.commits_blocked(&spec));

        // The standby gone: a required synchronous commit has no one to confirm it.
        let one = ClusterHealth {
            ready: 1,
            ..h.clone()
        };
        assert!(one.has_primary() && !one.all_ready() && one.commits_blocked(&spec));
        let preferred = ha(
            2,
            Some(Synchronous {
                data_durability: DataDurability::Preferred,
                ..Synchronous::default()
            }),
        );
        assert!(!one.commits_blocked(&preferred));

        // Not created yet, or no primary elected: nothing may start on it.
        assert!(!ClusterHealth::of("locks-lockdb", &spec, None).has_primary());
        let no_primary = ClusterHealth { primary: None, ..h };
        assert!(!no_primary.has_primary());
    }

    #[test]
    fn a_new_primary_is_a_failover_unless_a_switchover_was_under_way() {
        let spec = ha(2, Some(Synchronous::default()));
        let before = ClusterHealth {
            instances: 2,
            ready: 2,
            primary: Some("db-1".into()),
            timeline: Some(1),
            phase: Some("Cluster in healthy state".into()),
            synchronous: ClusterHealth::of("locks-lockdb", &spec, None).synchronous,
            ..ClusterHealth::default()
        };
        let first = before.status(None, "t0");
        assert_eq!(first.ready, "2/2");
        assert_eq!(first.synchronous, "any 1 (required)");
        assert!(
            first.last_primary_change.is_none(),
            "no earlier primary, no change"
        );
        assert!(before.status(Some(&first), "t1").last_primary_change.is_none());

        // CloudNativePG failing over: the phase is seen first, then the new primary.
        let failing = ClusterHealth {
            ready: 1,
            phase: Some(PHASE_FAILING_OVER.into()),
            ..before.clone()
        };
        let during = failing.status(Some(&first), "t2");
        let promoted = ClusterHealth {
            primary: Some("db-2".into()),
            timeline: Some(2),
            phase: Some("Cluster in healthy state".into()),
            ..failing
        };
        let after = promoted.status(Some(&during), "t3");
        let change = after.last_primary_change.clone().expect("a change");
        assert_eq!(
            (
                change.kind.as_str(),
                change.from.as_str(),
                change.to.as_str(),
                change.timeline
            ),
            ("Failover", "db-1", "db-2", Some(2))
        );
        assert_eq!(change.seen_at, "t3");
        // Carried over unchanged by the next look.
        let later = promoted.status(Some(&after), "t4");
        assert_eq!(later.last_primary_change, Some(change.clone()));

        // CloudNativePG naming the new primary before its timeline: the change is recorded at
        // once, its timeline filled in when it shows.
        let named_first = ClusterHealth {
            timeline: Some(1),
            ..promoted.clone()
        };
        let early = named_first.status(Some(&during), "t3");
        let pending = early.last_primary_change.clone().expect("a change");
        assert_eq!((pending.to.as_str(), pending.timeline), ("db-2", None));
        let filled = promoted.status(Some(&early), "t4");
        let filled = filled.last_primary_change.expect("still the change");
        assert_eq!((filled.timeline, filled.seen_at.as_str()), (Some(2), "t3"));

        // A switchover back: the phase said so.
        let switching = ClusterHealth {
            phase: Some(PHASE_SWITCHOVER.into()),
            ..promoted.clone()
        };
        let during = switching.status(Some(&later), "t5");
        let back = ClusterHealth {
            primary: Some("db-1".into()),
            timeline: Some(3),
            ..promoted
        };
        let change = back
            .status(Some(&during), "t6")
            .last_primary_change
            .expect("a change");
        assert_eq!((change.kind.as_str(), change.to.as_str()), ("Switchover", "db-1"));

        // While no instance is primary there is nothing to compare with.
        let none = ClusterHealth {
            primary: None,
            ..back
        };
        assert!(none.primary_change(Some(&during), "t7").is_none());
    }

    #[test]
    fn the_watched_promotion_decides_when_the_reconciles_missed_its_phase() {
        let before = ClusterHealth {
            instances: 2,
            ready: 2,
            primary: Some("db-1".into()),
            phase: Some("Cluster in healthy state".into()),
            ..ClusterHealth::default()
        };
        let first = before.status(None, "t0");
        // Two looks, both healthy: without the watch this reads as a failover.
        let after = ClusterHealth {
            primary: Some("db-2".into()),
            ..before.clone()
        };
        let missed = after.primary_change(Some(&first), "t1").expect("a change");
        assert_eq!(missed.kind, "Failover");

        let status = |phase: &str, current: &str, target: &str| ClusterStatus {
            phase: Some(phase.into()),
            current_primary: Some(current.into()),
            target_primary: Some(target.into()),
            ..ClusterStatus::default()
        };
        let switchover = Promotion::under_way(&status(PHASE_SWITCHOVER, "db-1", "db-2"));
        assert_eq!(
            switchover,
            Some(Promotion {
                switchover: true,
                from: "db-1".into(),
                to: "db-2".into()
            })
        );
        let seen = ClusterHealth {
            promotion: switchover,
            ..after.clone()
        };
        let change = seen.primary_change(Some(&first), "t1").expect("a change");
        assert_eq!(change.kind, "Switchover");

        // A failover the watch saw is one, whatever phase the looks caught.
        let failover = Promotion::under_way(&status(PHASE_FAILING_OVER, "db-1", "db-2"));
        let seen = ClusterHealth {
            promotion: failover,
            phase: Some(PHASE_SWITCHOVER.into()),
            ..after.clone()
        };
        assert_eq!(
            seen.primary_change(Some(&first), "t1").expect("a change").kind,
            "Failover"
        );

        // A promotion between other instances (an older one) does not decide this change.
        let other = ClusterHealth {
            promotion: Some(Promotion {
                switchover: true,
                from: "db-2".into(),
                to: "db-1".into(),
            }),
            ..after
        };
        assert_eq!(
            other.primary_change(Some(&first), "t1").expect("a change").kind,
            "Failover"
        );

        // A healthy phase, or a target that is the current primary: nothing under way.
        assert!(Promotion::under_way(&status("Cluster in healthy state", "db-1", "db-2")).is_none());
        assert!(Promotion::under_way(&status(PHASE_SWITCHOVER, "db-1", "db-1")).is_none());
    }
}
