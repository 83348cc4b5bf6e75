//! The generated credentials Secret (builders/credentials.rs) and who reads which key of it.

use super::*;
use crate::builders::credentials;

#[test]
fn payment_services_get_their_credentials_from_the_generated_secret_only() {
    let ps = default_stack();
    let owner = Owner::of(&ps).unwrap();
    let ls = ready_lock_service();
    let d =
        paymentstack::children::desired(&ps, &owner, &ps_inputs(&JobState::Succeeded, Some(&ls))).unwrap();
    let secret = credentials::credentials_secret_name(&owner);
    let wants: [(&str, &[(&str, &str)]); 3] = [
        (
            "payment-resource",
            &[
                ("PAYMENT_RESOURCE_ADMIN_TOKEN", credentials::KEY_ADMIN),
                ("PAYMENT_RESOURCE_EXECUTOR_TOKEN", credentials::KEY_EXECUTOR),
                ("PAYMENT_RESOURCE_CLIENT_TOKEN", credentials::KEY_CLIENT),
            ],
        ),
        (
            "rail-proxy",
            &[("RAIL_PROXY_EXECUTOR_TOKEN", credentials::KEY_RAIL_PROXY_EXECUTOR)],
        ),
        (
            "payout-executor",
            &[
                (
                    "PAYOUT_EXECUTOR_PAYMENT_RESOURCE_TOKEN",
                    credentials::KEY_EXECUTOR,
                ),
                (
                    "PAYOUT_EXECUTOR_RAIL_PROXY_TOKEN",
                    credentials::KEY_RAIL_PROXY_EXECUTOR,
                ),
            ],
        ),
    ];
    for (component, envs) in wants {
        let dep = deployment(&d, &owner.child(component));
        let c = &dep
            .spec
            .as_ref()
            .unwrap()
            .template
            .spec
            .as_ref()
            .unwrap()
            .containers[0];
        for (name, key) in envs {
            let e = env_of(c, name).unwrap_or_else(|| panic!("{component}: no {name}"));
            assert!(e.value.is_none(), "{component}: {name} is a plain value");
            assert_eq!(
                secret_ref(e),
                (secret.clone(), (*key).to_owned()),
                "{component}: {name}"
            );
        }
        // No credential travels as an argument.
        let args = c.args.clone().unwrap_or_default().join(" ");
        assert!(
            !args.contains("TOKEN") && !args.contains("token"),
            "{component}: {args}"
        );
    }
}
