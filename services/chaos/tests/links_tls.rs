//! The campaign's links over TLS, against a real rail-stub serving HTTPS under a CA made for the
//! test (testkit's `StackTls`, as a campaign run makes one): a link serves HTTPS with a certificate
//! of that CA and forwards over HTTPS verifying the service against that CA alone; a plain HTTP
//! caller, a caller without the CA and a service of another CA are all refused; and each fault
//! keeps its meaning over TLS — `Unknown` answers 503 without forwarding, `Reset` closes the
//! connection, `Blackhole` neither forwards nor answers, `DropAnswers` forwards and does not answer.

use std::sync::Arc;
use std::time::Duration;

use dlock_chaos::proxy::{InFlight, Link, LinkTls, Mode, Upstream};
use dlock_testkit::pg::tls::client_trusting;
use dlock_testkit::procs::{Service, Spec};
use dlock_testkit::stack::{StackServer, StackTls};
use serde_json::json;

/// A rail-stub in test mode (its behaviour can be set and read) serving HTTPS under `tls`'s CA.
async fn rail_stub(tls: &StackTls, dir: &std::path::Path) -> Service {
    let spec = Spec::new("rail-stub", "rail-stub").expect("a free port").args([
        "--listen",
        "127.0.0.1:{port}",
        "--mode",
        "ack",
        "--test-mode",
    ]);
    Service::start(tls.serve_as(StackServer::RailStub, spec), dir)
        .await
        .expect("rail-stub over HTTPS")
}

async fn link_to(stub: &Service, tls: &LinkTls) -> Link {
    Link::start(
        "test->rail",
        "test",
        Upstream::Rail,
        stub.port,
        None,
        Arc::new(InFlight::default()),
        Some(tls),
    )
    .await
    .expect("a link")
}

/// The rail-stub's behaviour mode, read from the service itself (not through the link).
async fn behaviour(client: &reqwest::Client, stub: &Service) -> String {
    let body: serde_json::Value = client
        .get(format!("{}/v1/admin/behaviour", stub.url()))
        .send()
        .await
        .expect("the rail-stub answers")
        .json()
        .await
        .expect("a JSON body");
    body["mode"].as_str().unwrap_or_default().to_ascii_lowercase()
}

fn set_behaviour(client: &reqwest::Client, url: &str, mode: &str) -> reqwest::RequestBuilder {
    client
        .put(format!("{url}/v1/admin/behaviour"))
        .json(&json!({"mode": mode, "latencyMs": 0}))
}

fn scratch(label: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("dlock-chaos-links-tls-{}-{label}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch folder");
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_speaks_https_on_both_sides_and_its_faults_keep_their_meaning() {
    let dir = scratch("faults");
    let tls = StackTls::new().expect("the test's CA");
    let stub = rail_stub(&tls, &dir).await;
    assert!(stub.url().starts_with("https://"), "{}", stub.url());
    let link_tls =
        LinkTls::new(&tls.issue("links").expect("a certificate"), tls.ca_file()).expect("link TLS");
    let link = link_to(&stub, &link_tls).await;
    assert!(link.url().starts_with("https://"), "{}", link.url());
    let client = client_trusting(tls.ca_file(), Duration::from_secs(5)).expect("a client of the CA");

    // Passing: answered through the link, the link verifying the stub against the CA.
    let r = client
        .get(format!("{}/readyz", link.url()))
        .send()
        .await
        .expect("an answer through the link");
    assert!(r.status().is_success(), "{}", r.status());

    // A plain HTTP request to the link gets no answer.
    let plain = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("a client");
    let r = plain
        .get(format!("http://127.0.0.1:{}/readyz", link.port))
        .send()
        .await;
    assert!(r.is_err(), "the link answered plain HTTP: {r:?}");
    // A client that trusts the built-in roots, or another CA, is refused at the handshake.
    let r = plain.get(format!("{}/readyz", link.url())).send().await;
    assert!(r.is_err(), "the link was trusted without the run's CA: {r:?}");
    let other = StackTls::new().expect("another CA");
    let other_client = client_trusting(other.ca_file(), Duration::from_secs(5)).expect("a client");
    let r = other_client.get(format!("{}/readyz", link.url())).send().await;
    assert!(r.is_err(), "the link was trusted with another CA: {r:?}");

    // Unknown: 503 without forwarding.
    link.set(Mode::Unknown);
    let r = set_behaviour(&client, &link.url(), "reject")
        .send()
        .await
        .expect("an answer");
    assert_eq!(r.status(), reqwest::StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        behaviour(&client, &stub).await,
        "ack",
        "Unknown forwarded the request"
    );

    // Reset: the connection closed at once, nothing forwarded.
    link.set(Mode::Reset);
    let r = set_behaviour(&client, &link.url(), "reject").send().await;
    let e = r.expect_err("a reset link answered");
    assert!(!e.is_timeout(), "a reset link held the request: {e}");
    assert_eq!(
        behaviour(&client, &stub).await,
        "ack",
        "Reset forwarded the request"
    );

    // Blackhole: nothing forwarded, nothing answered (the caller gives up).
    let patient = Duration::from_millis(500);
    link.set(Mode::Blackhole);
    let e = set_behaviour(&client, &link.url(), "reject")
        .timeout(patient)
        .send()
        .await
        .expect_err("a blackholed link answered");
    assert!(e.is_timeout(), "{e}");
    link.set(Mode::Pass);
    assert_eq!(
        behaviour(&client, &stub).await,
        "ack",
        "Blackhole forwarded the request"
    );

    // DropAnswers: forwarded (the stub acts), the answer lost.
    link.set(Mode::DropAnswers);
    let e = set_behaviour(&client, &link.url(), "reject")
        .timeout(patient)
        .send()
        .await
        .expect_err("an answer came back over a link dropping answers");
    assert!(e.is_timeout(), "{e}");
    // The stub acts once the request is through: wait for it (bounded), not a fixed time.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while behaviour(&client, &stub).await != "reject" {
        assert!(
            tokio::time::Instant::now() < deadline,
            "DropAnswers did not deliver the request"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    link.set(Mode::Pass);

    // Healed: answered again.
    let r = set_behaviour(&client, &link.url(), "ack")
        .send()
        .await
        .expect("an answer after the heal");
    assert!(r.status().is_success(), "{}", r.status());
    assert_eq!(behaviour(&client, &stub).await, "ack");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Negative control of the link's own verification: a service whose certificate another CA signed
/// is refused by the link (the caller's connection is closed without an answer), and nothing
/// reaches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_refuses_a_service_of_another_ca() {
    let dir = scratch("other-ca");
    let run = StackTls::new().expect("the run's CA");
    let other = StackTls::new().expect("another CA");
    let stub = rail_stub(&other, &dir).await;
    let link_tls =
        LinkTls::new(&run.issue("links").expect("a certificate"), run.ca_file()).expect("link TLS");
    let link = link_to(&stub, &link_tls).await;
    let client = client_trusting(run.ca_file(), Duration::from_secs(5)).expect("a client of the run's CA");
    let r = set_behaviour(&client, &link.url(), "reject").send().await;
    assert!(r.is_err(), "the link forwarded to a service of another CA: {r:?}");
    let stub_client = client_trusting(other.ca_file(), Duration::from_secs(5)).expect("a client");
    assert_eq!(
        behaviour(&stub_client, &stub).await,
        "ack",
        "the request reached the service"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
