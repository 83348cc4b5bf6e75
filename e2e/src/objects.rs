//! Reading Kubernetes objects as JSON.

use serde_json::Value;

pub fn name(obj: &Value) -> &str {
    obj["metadata"]["name"].as_str().unwrap_or_default()
}

pub fn uid(obj: &Value) -> &str {
    obj["metadata"]["uid"].as_str().unwrap_or_default()
}

pub fn kind(obj: &Value) -> &str {
    obj["kind"].as_str().unwrap_or_default()
}

pub fn label<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    obj["metadata"]["labels"][key].as_str()
}

/// "Kind/name" for messages.
pub fn describe(obj: &Value) -> String {
    format!("{}/{}", kind(obj), name(obj))
}

/// The owner reference with `controller: true`, if any.
pub fn controller_ref(obj: &Value) -> Option<&Value> {
    obj["metadata"]["ownerReferences"]
        .as_array()?
        .iter()
        .find(|r| r["controller"].as_bool() == Some(true))
}

/// True when `obj` is controlled by the object with this uid.
pub fn controlled_by(obj: &Value, owner_uid: &str) -> bool {
    controller_ref(obj).is_some_and(|r| r["uid"].as_str() == Some(owner_uid))
}

/// The objects in `items` that `owner` controls.
pub fn children<'a>(items: &'a [Value], owner: &Value) -> Vec<&'a Value> {
    let owner_uid = uid(owner);
    items.iter().filter(|o| controlled_by(o, owner_uid)).collect()
}

/// `status.conditions[type == t]`.
pub fn condition<'a>(obj: &'a Value, t: &str) -> Option<&'a Value> {
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"].as_str() == Some(t))
}

pub fn condition_is(obj: &Value, t: &str, status: &str) -> bool {
    condition(obj, t).is_some_and(|c| c["status"].as_str() == Some(status))
}

/// `metadata.generation` and `status.observedGeneration` agree (the controller has seen the latest
/// spec).
pub fn observed_current(obj: &Value) -> bool {
    let generation = obj["metadata"]["generation"].as_i64();
    generation.is_some() && obj["status"]["observedGeneration"].as_i64() == generation
}

/// `spec.replicas`, defaulting to 1 as the API server does.
pub fn replicas(obj: &Value) -> i64 {
    obj["spec"]["replicas"].as_i64().unwrap_or(1)
}

/// The first container of a pod-template-carrying object (Deployment, StatefulSet, Job).
pub fn container(obj: &Value) -> &Value {
    &obj["spec"]["template"]["spec"]["containers"][0]
}

/// Every image the object's pod template uses (init containers included).
pub fn images(obj: &Value) -> Vec<String> {
    let spec = &obj["spec"]["template"]["spec"];
    ["initContainers", "containers"]
        .iter()
        .filter_map(|k| spec[*k].as_array())
        .flatten()
        .filter_map(|c| c["image"].as_str().map(str::to_owned))
        .collect()
}
