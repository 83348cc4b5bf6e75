//! The LockService's part of the reconcile pipeline ([`super::pipeline`]): lockdb → migration Job →
//! lock-server, its admin Secret, and the actions (force-revoke, restore fast-forward, the periodic
//! fencing check) requested in its annotations.

use k8s_openapi::api::batch::v1::Job;

use super::error::Result;
use super::pipeline::{CreateOnce, Plan, Reconciled, at, invalid_spec};
use super::status::{Blocked, Observation};
use super::steps::{ActionsOutcome, Prepared, Store};
use super::{Context, Settings, actions, apply};
use crate::builders::actions::{
    self as action_plan, ActionEvent, ActionInputs, ActionPlan, CHECK_COMPONENT, RESTORE_COMPONENT,
    RestoreJobs,
};
use crate::builders::database::History;
use crate::builders::lockservice::{self as plan, HISTORY, Inputs};
use crate::builders::migration::JobState;
use crate::builders::workloads::LOCK_SERVER;
use crate::builders::{Child, Owner, SpecError};
use crate::crd::actions::ActionPhase;
use crate::crd::{Backend, DlockStatus, LockService, LockStore};
use crate::reasons::Reason;

impl Reconciled for LockService {
    const HISTORY: History = HISTORY;
    type Observed = ActionInputs;
    type Next = ActionPlan;

    fn status(&self) -> Option<&DlockStatus> {
        self.status.as_ref()
    }

    fn store(&self) -> std::result::Result<Store<'_>, SpecError> {
        match self.spec.store().ok_or(SpecError::StoreMissing)? {
            LockStore::Postgres(db) => Ok(Store::Database(db)),
            LockStore::Etcd(etcd) => Ok(Store::Etcd(etcd)),
        }
    }

    fn migration_job(&self, owner: &Owner, settings: &Settings) -> std::result::Result<Job, SpecError> {
        plan::migration_job(self, owner, &settings.default_image)
    }

    /// The actions' inputs: the requests, lock-server's view of the key to revoke, its pods, the
    /// restore and check Jobs, the PaymentStacks that use this LockService.
    async fn observe(
        &self,
        ctx: &Context,
        owner: &Owner,
        prepared: &Prepared,
        _obs: &mut Observation,
    ) -> Result<ActionInputs> {
        let lock_server_url = owner.http_url(&owner.child(LOCK_SERVER));
        let mut inputs = actions::observe(ctx, self, owner, &lock_server_url).await?;
        inputs.schema_ready = prepared.job_state == JobState::Succeeded;
        Ok(inputs)
    }

    /// The next action step first (it decides the gate), then the children it implies.
    fn plan(
        &self,
        settings: &Settings,
        owner: &Owner,
        prepared: &Prepared,
        observed: &ActionInputs,
    ) -> std::result::Result<Plan<ActionPlan>, Blocked> {
        let image = self
            .spec
            .migration_image
            .clone()
            .unwrap_or_else(|| plan::lock_server_image(self, &settings.default_image));
        let lockdb_admin_url = match self.spec.backend {
            Backend::Postgres => plan::lockdb_admin_url(self, owner).map_err(|e| invalid_spec(&e))?,
            // Never read: with etcd the actions plan no restore or check Job (they work on lockdb).
            Backend::Etcd => crate::builders::database::admin_url_source(owner, HISTORY, None),
        };
        let restore_jobs = RestoreJobs {
            owner,
            image: &image,
            lockdb_admin_url: &lockdb_admin_url,
        };
        let next = action_plan::plan(observed, &restore_jobs);
        let inputs = Inputs {
            default_image: &settings.default_image,
            database_ready: prepared.db.ready,
            migration: &prepared.job_state,
            db_secret_version: prepared.db.secret_version.as_deref(),
            gated: next.gated(),
        };
        let mut desired = plan::desired(self, owner, &inputs).map_err(|e| invalid_spec(&e))?;
        desired.apply.extend(next.jobs.iter().cloned().map(Child::Job));
        desired
            .apply
            .extend(next.check_job.iter().cloned().map(Child::Job));
        Ok(Plan {
            desired,
            secrets: vec![CreateOnce {
                secret: plan::admin_secret(owner),
                step: "create the lock-server admin Secret",
                note: "generated lock-server's admin token into a Secret",
            }],
            expected_deployments: 1,
            next,
        })
    }

    /// Orphaned restore and check Jobs (by label), then the one write outside Kubernetes: the
    /// revoke of the token recorded in status.
    async fn apply(
        &self,
        ctx: &Context,
        owner: &Owner,
        plan: &Plan<ActionPlan>,
        obs: &mut Observation,
    ) -> Result<(Option<ActionsOutcome>, Vec<ActionEvent>)> {
        let next = &plan.next;
        let keep: Vec<&str> = next
            .jobs
            .iter()
            .filter_map(|j| j.metadata.name.as_deref())
            .chain(next.keep_jobs.iter().map(String::as_str))
            .collect();
        apply::delete_stale_jobs(
            &ctx.client,
            &owner.namespace,
            &owner.component_selector(RESTORE_COMPONENT),
            &keep,
        )
        .await
        .map_err(at("delete finished restore Jobs"))?;
        let keep_check: Vec<&str> = next
            .check_job
            .iter()
            .filter_map(|j| j.metadata.name.as_deref())
            .chain(next.keep_check.as_deref())
            .collect();
        apply::delete_stale_jobs(
            &ctx.client,
            &owner.namespace,
            &owner.component_selector(CHECK_COMPONENT),
            &keep_check,
        )
        .await
        .map_err(at("delete finished fencing check Jobs"))?;

        let mut outcome = ActionsOutcome {
            actions: next.actions.clone(),
            gate: next.gate.clone(),
            fencing: next.fencing.clone(),
            busy: next.busy,
            // Look again in time for the next fencing check.
            requeue_within: ctx.settings.fencing_check_interval,
        };
        let mut events = next.events.clone();
        if let Some(call) = &next.revoke {
            let lock_server_url = owner.http_url(&owner.child(LOCK_SERVER));
            let answer = actions::revoke(ctx, owner, &lock_server_url, call).await?;
            if let Some(running) = outcome.actions.iter_mut().find(|a| a.id == call.id) {
                let (done, event) = action_plan::revoke_outcome(running, &answer, &actions::now());
                tracing::info!(event = "action_finished", id = %call.id, key = %call.key, token = call.token, outcome = %answer.outcome);
                *running = done;
                events.push(event);
            }
        }

        // A sequence found behind the resources' high-water needs a restore fast-forward.
        ctx.metrics
            .fencing_observed(&owner.namespace, &owner.name, outcome.fencing.as_ref());
        if let Some(f) = outcome
            .fencing
            .as_ref()
            .filter(|f| f.is_behind() && outcome.gate.is_none())
        {
            obs.blocked = Some(Blocked::new(
                Reason::FencingSequenceBehind,
                action_plan::behind_message(f),
            ));
        }
        // A failed restore keeps the gate closed and needs a human.
        if let Some(gate) = &outcome.gate {
            obs.gated = Some(Blocked::new(Reason::LockTrafficGated, gate.message.clone()));
            if let Some(f) = outcome
                .actions
                .iter()
                .find(|a| a.id == gate.action_id)
                .filter(|a| a.phase == ActionPhase::Failed)
            {
                obs.blocked = Some(Blocked::new(
                    Reason::RestoreFailed,
                    format!(
                        "lock traffic stays gated: restore {} failed: {}",
                        f.id,
                        f.message.as_deref().unwrap_or_default()
                    ),
                ));
            }
        }
        Ok((Some(outcome), events))
    }
}
