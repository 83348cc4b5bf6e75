//! The Pod Security Standard "restricted", for every pod the operator creates (its Deployments, its
//! Jobs, the PostgreSQL and etcd StatefulSets): the pod runs as a user other than root with the
//! runtime's default seccomp profile; each container cannot gain privileges, holds no capability,
//! and has a read-only root filesystem, with an emptyDir at `/tmp` for what a process writes there.
//! A namespace labelled `pod-security.kubernetes.io/enforce: restricted` admits them (the kind tier
//! runs the whole stack in one). CloudNativePG builds its own pods, which meet the standard too.
//!
//! One pass over the finished pod ([`restrict`]), so that no builder can forget a field; what a
//! builder knows better (the user its image needs, a directory its process writes) it sets itself,
//! and the pass keeps it.

use k8s_openapi::api::core::v1::{
    Capabilities, Container, EmptyDirVolumeSource, PodSecurityContext, PodSpec, SeccompProfile,
    SecurityContext, Volume, VolumeMount,
};

/// The user the dlock image runs as (its `USER`, distroless's `nonroot`), also given to images that
/// would otherwise run as root (etcd's).
pub const NONROOT_UID: i64 = 65532;

/// The emptyDir every container gets at `/tmp`.
const TMP_VOLUME: &str = "tmp";

/// Makes `pod` meet "restricted", keeping what its builder set (a user, an fsGroup).
pub fn restrict(pod: &mut PodSpec) {
    let sc = pod
        .security_context
        .get_or_insert_with(PodSecurityContext::default);
    sc.run_as_non_root = Some(true);
    sc.seccomp_profile.get_or_insert_with(|| SeccompProfile {
        type_: "RuntimeDefault".into(),
        ..SeccompProfile::default()
    });
    let mut needs_tmp = false;
    for c in pod
        .containers
        .iter_mut()
        .chain(pod.init_containers.iter_mut().flatten())
    {
        restrict_container(c);
        let mounts = c.volume_mounts.get_or_insert_with(Vec::new);
        if !mounts.iter().any(|m| m.mount_path == "/tmp") {
            mounts.push(VolumeMount {
                name: TMP_VOLUME.into(),
                mount_path: "/tmp".into(),
                ..VolumeMount::default()
            });
            needs_tmp = true;
        }
    }
    let volumes = pod.volumes.get_or_insert_with(Vec::new);
    if needs_tmp && !volumes.iter().any(|v| v.name == TMP_VOLUME) {
        volumes.push(empty_dir(TMP_VOLUME));
    }
}

fn restrict_container(c: &mut Container) {
    let sc = c.security_context.get_or_insert_with(SecurityContext::default);
    sc.allow_privilege_escalation = Some(false);
    sc.privileged = Some(false);
    sc.run_as_non_root = Some(true);
    sc.capabilities = Some(Capabilities {
        drop: Some(vec!["ALL".into()]),
        add: None,
    });
    sc.read_only_root_filesystem.get_or_insert(true);
}

/// An emptyDir volume named `name`.
pub fn empty_dir(name: &str) -> Volume {
    Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Volume::default()
    }
}

/// Whether `pod` meets what [`restrict`] sets: the test of every builder's pods, and the words of
/// what it lacks.
pub fn violations(pod: &PodSpec) -> Vec<String> {
    let mut out = Vec::new();
    let sc = pod.security_context.as_ref();
    if sc.and_then(|s| s.run_as_non_root) != Some(true) {
        out.push("pod: runAsNonRoot is not true".to_owned());
    }
    if sc.and_then(|s| s.run_as_user) == Some(0) {
        out.push("pod: runAsUser is 0".to_owned());
    }
    if sc
        .and_then(|s| s.seccomp_profile.as_ref())
        .map(|p| p.type_.as_str())
        != Some("RuntimeDefault")
    {
        out.push("pod: seccompProfile is not RuntimeDefault".to_owned());
    }
    for c in pod.containers.iter().chain(pod.init_containers.iter().flatten()) {
        let s = c.security_context.as_ref();
        let name = &c.name;
        if s.and_then(|s| s.allow_privilege_escalation) != Some(false) {
            out.push(format!("{name}: allowPrivilegeEscalation is not false"));
        }
        let drops_all = s
            .and_then(|s| s.capabilities.as_ref())
            .and_then(|c| c.drop.as_ref())
            .is_some_and(|d| d.iter().any(|x| x == "ALL"));
        if !drops_all {
            out.push(format!("{name}: capabilities do not drop ALL"));
        }
        if s.and_then(|s| s.capabilities.as_ref())
            .and_then(|c| c.add.as_ref())
            .is_some_and(|a| !a.is_empty())
        {
            out.push(format!("{name}: capabilities are added"));
        }
        if s.and_then(|s| s.read_only_root_filesystem) != Some(true) {
            out.push(format!("{name}: the root filesystem is writable"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_pod_is_restricted_and_keeps_what_its_builder_set() {
        let mut pod = PodSpec {
            containers: vec![Container {
                name: "c".into(),
                ..Container::default()
            }],
            security_context: Some(PodSecurityContext {
                run_as_user: Some(999),
                fs_group: Some(999),
                ..PodSecurityContext::default()
            }),
            ..PodSpec::default()
        };
        assert!(
            !violations(&pod).is_empty(),
            "the negative control: a bare pod violates"
        );
        restrict(&mut pod);
        assert_eq!(violations(&pod), Vec::<String>::new());
        let sc = pod.security_context.as_ref().unwrap();
        assert_eq!((sc.run_as_user, sc.fs_group), (Some(999), Some(999)));
        // /tmp is writable, once.
        restrict(&mut pod);
        assert_eq!(pod.volumes.as_ref().unwrap().len(), 1);
        assert_eq!(pod.containers[0].volume_mounts.as_ref().unwrap().len(), 1);
    }
}
