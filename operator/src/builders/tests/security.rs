//! Every pod the operator creates meets the Pod Security Standard "restricted"
//! (builders/security.rs): the workloads of every kind of spec, the migration Jobs, the database and
//! etcd StatefulSets, and the restore Jobs of the actions.

use super::*;
use crate::actions::jobs::{self, RestoreJobs};
use crate::actions::testing::{self, restore_inputs};
use crate::builders::security::violations;

fn pods_of(d: &Desired) -> Vec<(String, k8s_openapi::api::core::v1::PodSpec)> {
    d.apply
        .iter()
        .filter_map(|c| Some((format!("{:?} {}", c.kind(), c.name()), pod_spec(c)?)))
        .collect()
}

#[test]
fn every_pod_of_every_spec_is_restricted() {
    let mut pods = Vec::new();
    let succeeded = JobState::Succeeded;
    for ls in [
        managed_ls(),
        lock_service(json!({"database": {"external": {"secretRef": {"name": "cloudsql"}}}})),
    ] {
        let owner = Owner::of(&ls).unwrap();
        pods.extend(pods_of(
            &lockservice::children::desired(&ls, &owner, &ls_inputs(&succeeded)).unwrap(),
        ));
    }
    for etcd in [
        json!({"managed": {}}),
        json!({"managed": {"storage": {"emptyDir": true}}}),
    ] {
        let ls = etcd_ls(etcd);
        let owner = Owner::of(&ls).unwrap();
        pods.extend(pods_of(
            &lockservice::children::desired(&ls, &owner, &etcd_inputs(true)).unwrap(),
        ));
    }
    let ps = default_stack();
    let owner = Owner::of(&ps).unwrap();
    let view = ready_lock_service();
    pods.extend(pods_of(
        &paymentstack::children::desired(&ps, &owner, &ps_inputs(&succeeded, Some(&view))).unwrap(),
    ));
    let (owner, secret) = (testing::owner(), testing::secret());
    let jobs = RestoreJobs {
        owner: &owner,
        image: IMAGE,
        lockdb_admin_url: &secret,
    };
    let stacks = restore_inputs().stacks;
    for job in [
        jobs::read_job(&jobs, "ff-read".into(), "restore-read", &stacks),
        jobs::advance_job(&jobs, "ff-advance".into(), 42),
    ] {
        let pod = job.spec.as_ref().and_then(|s| s.template.spec.clone()).unwrap();
        pods.push((format!("restore Job {:?}", job.metadata.name), pod));
    }
    let kinds: Vec<&str> = pods.iter().map(|(n, _)| n.as_str()).collect();
    for want in [
        "StatefulSet locks-lockdb",
        "StatefulSet locks-etcd",
        "Deployment locks-lock-server",
        "Job",
        "restore Job",
    ] {
        assert!(
            kinds.iter().any(|k| k.starts_with(want)),
            "no {want} among {kinds:?}"
        );
    }
    for (name, pod) in &pods {
        assert_eq!(violations(pod), Vec::<String>::new(), "{name}");
    }
}

/// The images that would run as root are told whom to run as; the dlock image's own `USER`
/// (65532) stands for the rest. PostgreSQL writes its socket to an emptyDir.
#[test]
fn postgres_and_etcd_run_as_their_users_and_write_only_their_volumes() {
    let ls = managed_ls();
    let owner = Owner::of(&ls).unwrap();
    let d = lockservice::children::desired(&ls, &owner, &ls_inputs(&JobState::Absent)).unwrap();
    let pg = pod_spec(d.find(ChildKind::StatefulSet, "locks-lockdb").unwrap()).unwrap();
    let sc = pg.security_context.clone().unwrap();
    assert_eq!(
        (sc.run_as_user, sc.run_as_group, sc.fs_group),
        (Some(999), Some(999), Some(999))
    );
    let mounts: Vec<String> = pg.containers[0]
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| m.mount_path.clone())
        .collect();
    for path in ["/var/lib/postgresql/data", "/var/run/postgresql", "/tmp"] {
        assert!(mounts.iter().any(|m| m == path), "{path} not in {mounts:?}");
    }

    let ls = etcd_ls(json!({"managed": {}}));
    let owner = Owner::of(&ls).unwrap();
    let d = lockservice::children::desired(&ls, &owner, &etcd_inputs(true)).unwrap();
    let etcd = pod_spec(d.find(ChildKind::StatefulSet, "locks-etcd").unwrap()).unwrap();
    let sc = etcd.security_context.unwrap();
    assert_eq!((sc.run_as_user, sc.fs_group), (Some(65532), Some(65532)));
}
