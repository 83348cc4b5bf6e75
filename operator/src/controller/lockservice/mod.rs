//! The LockService's part of the reconcile pipeline ([`super::pipeline`]): lockdb → migration Job →
//! lock-server ([`children`], pure), its admin Secret, its grant signing keys ([`keys`], pure;
//! [`grants`], their reads and writes), lock-server's clients file (built from the PaymentStacks'
//! lock clients, `crate::builders::lock_clients`; [`clients`], its reads), and the actions (force-revoke, restore fast-forward, the
//! periodic fencing check, lock-server's sequence jumps, [`crate::actions`]) requested in its
//! annotations. The kind's outcome is [`ActionsOutcome`]: the action and grant-key parts of status,
//! and what they mean for the verdict.

pub mod children;
pub mod clients;
pub mod grants;
pub mod keys;

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;

use super::apply;
use super::pipeline::{Reconciled, invalid_spec};
use super::steps::{CreateOnce, Plan, Prepared, Store};
use super::verdict::{Blocked, KindOutcome, KindVerdict};
use crate::actions::check::behind_message;
use crate::actions::jobs::{CHECK_COMPONENT, RESTORE_COMPONENT, RestoreJobs};
use crate::actions::{self, ActionInputs, ActionPlan, client, observe, revoke};
use crate::builders::etcd_members::ETCD;
use crate::builders::lock_clients::{self, ClientToken};
use crate::builders::postgres::History;
use crate::builders::{Child, LOCK_SERVER, Owner, SpecError, credentials};
use crate::context::{Context, Settings};
use crate::crd::actions::ActionPhase;
use crate::crd::{Backend, DlockStatus, LockService, LockStore, TlsSpec};
use crate::error::{Result, at};
use crate::health::{DeploymentHealth, JobState};
use crate::reasons::{EventNote, Reason};
use children::{HISTORY, Inputs};
use clients::ClientInputs;
use keys::{GrantInputs, GrantPlan};

/// How soon a reconcile with an action in flight runs again (status writes also trigger one).
const REQUEUE_ACTION: Duration = Duration::from_secs(2);
/// How soon a reconcile during a grant-key rotation runs again (the stacks' rolls are watched too).
const REQUEUE_ROTATION: Duration = Duration::from_secs(10);
/// How soon a reconcile runs again while a stack's lock client Secret is missing (Secrets are not
/// watched; the stack's own reconcile creates it).
const REQUEUE_CLIENTS: Duration = Duration::from_secs(10);

/// What a LockService reconcile reads besides the store: the actions' inputs and the grant keys'.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    pub actions: ActionInputs,
    pub grants: GrantInputs,
    pub clients: ClientInputs,
}

/// The kind's own next step: the actions' and the grant keys'.
#[derive(Debug, Clone, Default)]
pub struct Next {
    pub actions: ActionPlan,
    pub grants: GrantPlan,
    /// Its Event, when it differs from the one written before.
    pub clients_event: Option<EventNote>,
    /// Stacks left out until their lock client Secret exists.
    pub clients_waiting: bool,
}

/// The action part of the status a LockService reconcile computed, and its Events: the planned
/// step with the pinned revoke's answer recorded.
#[derive(Debug, Clone, Default)]
pub struct ActionsOutcome {
    pub done: ActionPlan,
    /// Look again at least this often (the fencing check interval).
    pub requeue_within: Option<Duration>,
    /// `status.grants` as planned (after the key write this reconcile made).
    pub grants: crate::crd::GrantStatus,
    /// A grant-key rotation is under way.
    pub rotating: bool,
    /// A stack's lock client is not in the clients file yet.
    pub clients_waiting: bool,
}

impl KindOutcome for ActionsOutcome {
    /// A sequence found behind the resources' high-water needs a restore fast-forward; a closed gate
    /// holds lock traffic; a failed restore keeps it closed and needs a human.
    fn verdict(&self) -> KindVerdict {
        let done = &self.done;
        let mut v = KindVerdict::default();
        if let Some(f) = done
            .fencing
            .as_ref()
            .filter(|f| f.is_behind() && done.gate.is_none())
        {
            v.blocked = Some(Blocked::new(Reason::FencingSequenceBehind, behind_message(f)));
        }
        if let Some(gate) = &done.gate {
            v.gated = Some(Blocked::new(Reason::LockTrafficGated, gate.message.clone()));
            if let Some(f) = done
                .actions
                .iter()
                .find(|a| a.id == gate.action_id)
                .filter(|a| a.phase == ActionPhase::Failed)
            {
                v.blocked = Some(Blocked::new(
                    Reason::RestoreFailed,
                    format!(
                        "lock traffic stays gated: restore {} failed: {}",
                        f.id,
                        f.message.as_deref().unwrap_or_default()
                    ),
                ));
            }
        }
        v
    }

    fn write_status(&self, status: &mut DlockStatus) {
        status.grants = Some(self.grants.clone());
        status.actions = self.done.actions.clone();
        status.gate = self.done.gate.clone();
        status.fencing = self.done.fencing.clone().or(status.fencing.take());
        status.sequence = self.done.sequence.clone().or(status.sequence.take());
        status.last_action = actions::last_action(&status.actions);
    }

    fn requeue(&self, after: Duration) -> Duration {
        if self.done.busy {
            REQUEUE_ACTION
        } else if self.rotating {
            after.min(REQUEUE_ROTATION)
        } else if self.clients_waiting {
            after.min(REQUEUE_CLIENTS)
        } else {
            after.min(self.requeue_within.unwrap_or(after))
        }
    }

    fn events(&self) -> &[EventNote] {
        &self.done.events
    }
}

impl Reconciled for LockService {
    const HISTORY: History = HISTORY;
    type Observed = Observed;
    type Next = Next;
    type Outcome = ActionsOutcome;
    const SERVED: &'static [&'static str] = &[LOCK_SERVER, ETCD, crate::builders::tls::LOCKDB];

    fn status(&self) -> Option<&DlockStatus> {
        self.status.as_ref()
    }

    fn tls(&self) -> &TlsSpec {
        &self.spec.tls
    }

    fn store(&self) -> std::result::Result<Store<'_>, SpecError> {
        match self.spec.store().ok_or(SpecError::StoreMissing)? {
            LockStore::Postgres(db) => Ok(Store::Database(db)),
            LockStore::Etcd(etcd) => Ok(Store::Etcd(etcd)),
        }
    }

    fn migration_job(&self, owner: &Owner, settings: &Settings) -> std::result::Result<Job, SpecError> {
        children::migration_job(self, owner, &settings.default_image)
    }

    /// The actions' inputs: the requests, lock-server's view of the key to revoke, its pods, the
    /// restore and check Jobs, the PaymentStacks that use this LockService; and the grant keys'.
    async fn observe(&self, ctx: &Context, owner: &Owner, prepared: &Prepared) -> Result<Observed> {
        let lock_server_url = owner.http_url(&owner.child(LOCK_SERVER));
        let stacks = observe::stacks_using(ctx, self, owner).await?;
        let mut actions = observe::observe(ctx, self, owner, &lock_server_url, &stacks).await?;
        actions.schema_ready = prepared.job_state == JobState::Succeeded;
        let grants = grants::observe(ctx, self, owner, &stacks).await?;
        let clients = clients::observe(ctx, self, owner, &stacks).await?;
        Ok(Observed {
            actions,
            grants,
            clients,
        })
    }

    /// The next action step first (it decides the gate), then the children it implies.
    fn plan(
        &self,
        settings: &Settings,
        owner: &Owner,
        prepared: &Prepared,
        observed: &Observed,
    ) -> std::result::Result<Plan<Next>, Blocked> {
        let image = self
            .spec
            .migration_image
            .clone()
            .unwrap_or_else(|| children::lock_server_image(self, &settings.default_image));
        let lockdb_admin_url = match self.spec.backend {
            Backend::Postgres => children::lockdb_admin_url(self, owner).map_err(|e| invalid_spec(&e))?,
            // Never read: with etcd the actions plan no restore or check Job (they work on lockdb).
            Backend::Etcd => crate::builders::postgres::admin_url_source(owner, HISTORY, None),
        };
        let restore_jobs = RestoreJobs {
            owner,
            image: &image,
            lockdb_admin_url: &lockdb_admin_url,
        };
        let next = actions::plan(&observed.actions, &restore_jobs);
        let grants = keys::plan(&observed.grants);
        if let Some(broken) = &grants.broken {
            return Err(Blocked::new(Reason::GrantKeysInvalid, broken.clone()));
        }
        // The clients file: the stacks' clients and the LockService's own. One that cannot be built
        // stops here, before anything is written, so lock-server keeps the file it runs with.
        let seen = &observed.clients;
        let own = match &seen.own {
            None => None,
            Some(Ok(text)) => Some(text.as_str()),
            Some(Err(why)) => return Err(Blocked::new(Reason::LockClientsInvalid, why.clone())),
        };
        let reserve = seen.reserve.clone().unwrap_or_else(ClientToken::generate);
        let clients = lock_clients::clients_file(&seen.stacks, own, &reserve).map_err(|e| {
            Blocked::new(
                Reason::LockClientsInvalid,
                format!("cannot build lock-server's clients file: {e}"),
            )
        })?;
        let clients_event = clients::changed(&clients, seen);
        let inputs = Inputs {
            default_image: &settings.default_image,
            database_ready: prepared.db.ready,
            migration: &prepared.job_state,
            db_secret_version: prepared.db.secret_version.as_deref(),
            gated: next.gated(),
            signing_key: grants.signer.as_ref().map(|k| k.as_str()),
            scraper: settings.scraper.as_ref(),
            lock_clients: &clients,
        };
        let mut desired = children::desired(self, owner, &inputs).map_err(|e| invalid_spec(&e))?;
        desired.apply.extend(next.jobs.iter().cloned().map(Child::Job));
        desired
            .apply
            .extend(next.check_job.iter().cloned().map(Child::Job));
        Ok(Plan {
            desired,
            secrets: vec![CreateOnce {
                secret: credentials::admin_secret(owner),
                step: "create the lock-server admin Secret",
                note: "generated lock-server's admin token into a Secret",
            }],
            expected_deployments: 1,
            next: Next {
                actions: next,
                grants,
                clients_event,
                clients_waiting: !seen.waiting.is_empty(),
            },
        })
    }

    /// The grant-key write (the first key, an added or retired one, a refused request), orphaned
    /// restore and check Jobs (by label), then the one write outside Kubernetes: the revoke of the
    /// token recorded in status.
    async fn apply(
        &self,
        ctx: &Context,
        owner: &Owner,
        plan: &Plan<Next>,
        _deployments: &[DeploymentHealth],
    ) -> Result<ActionsOutcome> {
        let key_event = grants::write(ctx, owner, &plan.next.grants).await?;
        let next = &plan.next.actions;
        let restore = next.jobs.iter().filter_map(|j| j.metadata.name.as_deref());
        let check = next.check_job.iter().filter_map(|j| j.metadata.name.as_deref());
        let families: [(&str, Vec<&str>, &'static str); 2] = [
            (
                RESTORE_COMPONENT,
                restore.chain(next.keep_jobs.iter().map(String::as_str)).collect(),
                "delete finished restore Jobs",
            ),
            (
                CHECK_COMPONENT,
                check.chain(next.keep_check.as_deref()).collect(),
                "delete finished fencing check Jobs",
            ),
        ];
        for (component, keep, step) in families {
            apply::delete_stale_jobs(
                &ctx.client,
                &owner.namespace,
                &owner.component_selector(component),
                &keep,
            )
            .await
            .map_err(at(step))?;
        }

        let mut done = next.clone();
        if let Some(call) = &next.revoke {
            let lock_server_url = owner.http_url(&owner.child(LOCK_SERVER));
            let answer = client::revoke(ctx, owner, &lock_server_url, call).await?;
            if let Some(running) = done.actions.iter_mut().find(|a| a.id == call.id) {
                let (finished, event) = revoke::outcome(running, &answer, &observe::now());
                tracing::info!(event = "action_finished", id = %call.id, key = %call.key, token = call.token, outcome = %answer.outcome);
                *running = finished;
                done.events.push(event);
            }
        }
        ctx.metrics
            .fencing_observed(&owner.namespace, &owner.name, done.fencing.as_ref());
        let recorded = self.status.as_ref().and_then(|s| s.sequence.as_ref());
        if let Some(jump) = done
            .sequence
            .as_ref()
            .and_then(|s| s.last_jump.as_ref())
            .filter(|j| recorded.and_then(|s| s.last_jump.as_ref()) != Some(*j))
        {
            tracing::info!(event = "sequence_jump_observed", namespace = %owner.namespace, name = %owner.name, cause = %jump.cause, found = jump.found, jumped_to = jump.jumped_to, timeline = jump.timeline, system_identifier = %jump.system_identifier, fencing_check = ?done.sequence.as_ref().and_then(|s| s.fencing_check.as_deref()));
        }
        let planned = &plan.next.grants;
        done.events.extend(key_event);
        // The clients Secret was applied with the children: say what it now lists.
        if let Some(e) = &plan.next.clients_event {
            tracing::info!(event = "lock_clients_changed", namespace = %owner.namespace, name = %owner.name, note = %e.note);
            done.events.push(e.clone());
        }
        let before = self
            .status
            .as_ref()
            .and_then(|s| s.grants.as_ref())
            .and_then(|g| g.signing_key_id.clone());
        if let Some(now) = planned
            .status
            .signing_key_id
            .clone()
            .filter(|now| Some(now) != before.as_ref())
        {
            tracing::info!(event = "grant_signing_key_switched", namespace = %owner.namespace, name = %owner.name, key_id = %now);
            done.events.push(crate::reasons::EventNote {
                reason: Reason::GrantSigningKeySwitched,
                warning: false,
                note: format!(
                    "lock-server signs grants with {now} (was {})",
                    before.as_deref().unwrap_or("none")
                ),
            });
        }
        Ok(ActionsOutcome {
            done,
            // Look again in time for the next fencing check.
            requeue_within: ctx.settings.fencing_check_interval,
            grants: planned.status.clone(),
            rotating: planned.rotating,
            clients_waiting: plan.next.clients_waiting,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::jiff::Timestamp;

    use super::*;
    use crate::controller::verdict::{Applied, Reconciliation, Stopped, status_of};
    use crate::crd::{JumpCause, SequenceJump, SequenceStatus};

    fn sequence() -> SequenceStatus {
        SequenceStatus {
            jumps_enabled: true,
            last_jump: Some(SequenceJump {
                at: "2026-03-01T10:00:20Z".into(),
                cause: JumpCause::NewTimeline,
                found: 41,
                jumped_to: 562_949_953_421_312,
                system_identifier: "7345".into(),
                timeline: 2,
                postmaster_started: "2026-03-01T09:59:58Z".into(),
            }),
            fencing_check: None,
            restore: None,
        }
    }

    fn applied(done: ActionPlan) -> Reconciliation<ActionsOutcome> {
        Reconciliation::Applied(Applied {
            database_ready: true,
            etcd: None,
            cluster: None,
            migration: None,
            deployments: Vec::new(),
            expected_deployments: 0,
            endpoints: BTreeMap::new(),
            tls: None,
            kind: ActionsOutcome {
                done,
                ..ActionsOutcome::default()
            },
        })
    }

    /// The jump the actions planned is what status carries; a reconcile that planned none (lock-server
    /// did not answer: the plan keeps the stored one) or stopped early keeps the stored one.
    #[test]
    fn status_carries_the_jump_and_keeps_it_when_nothing_was_read() {
        let now = Timestamp::from_second(1_772_359_230).unwrap();
        let done = ActionPlan {
            sequence: Some(sequence()),
            ..ActionPlan::default()
        };
        let (first, _) = status_of(None, Some(1), HISTORY, &applied(done), now);
        assert_eq!(first.sequence, Some(sequence()));
        let json = serde_json::to_value(&first).unwrap();
        assert_eq!(json["sequence"]["lastJump"]["timeline"], 2);
        assert_eq!(json["sequence"]["lastJump"]["cause"], "new_timeline");

        let (kept, _) = status_of(
            Some(&first),
            Some(1),
            HISTORY,
            &applied(ActionPlan::default()),
            now,
        );
        assert_eq!(kept.sequence, Some(sequence()));
        let stopped: Reconciliation<ActionsOutcome> = Reconciliation::Stopped(Stopped {
            blocked: Blocked::new(Reason::InvalidSpec, "x"),
            etcd: None,
        });
        let (kept, _) = status_of(Some(&first), Some(1), HISTORY, &stopped, now);
        assert_eq!(kept.sequence, Some(sequence()));
    }
}
