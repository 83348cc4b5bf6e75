//! TLS to etcd: the client's TLS options from the configured files ([`options`]), and why a
//! connection to etcd fails, in an operator's words ([`explain`]).
//!
//! etcd-client speaks TLS through tonic's rustls connector (ring, as every TLS endpoint here). Only
//! the CA of `--etcd-ca-file` is trusted, and etcd's certificate must name the endpoint's host.

use std::error::Error as StdError;

use etcd_client::{Certificate, Identity, TlsOptions};

use crate::config::EtcdTlsFiles;

/// The client's TLS options: the CA file's certificates as the only roots, and the client
/// certificate when there is one. The files were checked at start-up
/// ([`EtcdTlsFiles::check`]); they are read again here, so a failure names the file.
pub fn options(files: &EtcdTlsFiles) -> Result<TlsOptions, std::io::Error> {
    let read = |path: &std::path::Path| {
        std::fs::read(path).map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))
    };
    let mut options = TlsOptions::new().ca_certificate(Certificate::from_pem(read(&files.ca)?));
    if let Some(client) = &files.client {
        options = options.identity(Identity::from_pem(read(&client.cert)?, read(&client.key)?));
    }
    Ok(options)
}

/// Why etcd could not be reached, said for an operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Explained {
    /// The message: what is wrong, which file to look at, then the TLS library's own words.
    pub message: String,
    /// A TLS refusal: a configuration to fix (ERROR), not a server that is not there yet (WARN).
    pub tls: bool,
}

/// The rustls error somewhere in `e`'s chain of causes: tokio-rustls and hyper carry it inside
/// `std::io::Error`s, whose `source()` skips the error they wrap, so each is looked into.
fn rustls_cause<'a>(e: &'a (dyn StdError + 'static)) -> Option<&'a rustls::Error> {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(r) = err.downcast_ref::<rustls::Error>() {
            return Some(r);
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && let Some(inner) = io.get_ref()
            && let Some(r) = rustls_cause(inner)
        {
            return Some(r);
        }
        cur = err.source();
    }
    None
}

/// Every message of `e`'s chain, joined with ": " (tonic's own says only "transport error").
fn chain(e: &(dyn StdError + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut cur = e.source();
    while let Some(err) = cur {
        let text = err.to_string();
        if parts.last() != Some(&text) {
            parts.push(text);
        }
        cur = err.source();
    }
    parts.join(": ")
}

/// `e` (from a call to etcd at `endpoints`) in an operator's words: for a TLS refusal, which side
/// refused and which file to look at.
pub fn explain(e: &etcd_client::Error, endpoints: &[String], tls: Option<&EtcdTlsFiles>) -> Explained {
    // tonic turns a failed connection into a gRPC status whose source is the transport error.
    let cause: &(dyn StdError + 'static) = match e {
        etcd_client::Error::TransportError(t) => t,
        etcd_client::Error::GRpcStatus(s) => s,
        other => other,
    };
    let detail = chain(cause);
    let at = endpoints.join(",");
    let ca = tls.map_or_else(|| "?".to_owned(), |t| t.ca.display().to_string());
    let client = tls
        .and_then(|t| t.client.as_ref())
        .map(|c| c.cert.display().to_string());
    let said = |what: String| Explained {
        message: format!("etcd at {at}: {what} ({detail})"),
        tls: true,
    };
    // Our side refused etcd's certificate: the rustls error is in the chain.
    if let Some(r) = rustls_cause(cause) {
        use rustls::{CertificateError as C, Error as R};
        return said(match r {
            R::InvalidCertificate(C::UnknownIssuer | C::BadSignature) => format!(
                "TLS verification failed: etcd's certificate is not signed by the CA in --etcd-ca-file {ca}"
            ),
            R::InvalidCertificate(C::NotValidForName | C::NotValidForNameContext { .. }) => format!(
                "TLS verification failed: etcd's certificate (signed by the CA in --etcd-ca-file {ca}) does not name the host of the endpoint"
            ),
            R::InvalidCertificate(C::Expired | C::ExpiredContext { .. }) => {
                "TLS verification failed: etcd's certificate has expired".to_owned()
            }
            R::InvalidCertificate(_) => format!(
                "TLS verification failed: etcd's certificate is refused (CA file --etcd-ca-file {ca})"
            ),
            _ => "the TLS handshake failed".to_owned(),
        });
    }
    // etcd refused ours. With TLS 1.3 the client's side of the handshake is done before etcd
    // checks the client certificate, so its refusal arrives later, through the HTTP/2 connection,
    // which keeps only the words of the alert, or, when etcd's close wins the race with the alert,
    // not even those: a connection closed at once, with TLS configured, is then said as the likely
    // refusal ("it seems").
    let not_tls = Explained {
        message: format!("etcd at {at} does not answer: {detail}"),
        tls: false,
    };
    if tls.is_none() {
        return not_tls;
    }
    let alert = detail.split("received fatal alert: ").nth(1).map(|rest| {
        rest.split(|c: char| !c.is_ascii_alphanumeric())
            .next()
            .unwrap_or("")
    });
    let certificate_alert = alert.is_some_and(|a| {
        matches!(
            a,
            "CertificateRequired"
                | "BadCertificate"
                | "UnknownCA"
                | "CertificateUnknown"
                | "UnsupportedCertificate"
                | "CertificateExpired"
                | "CertificateRevoked"
                | "AccessDenied"
        )
    });
    let closed = ["connection closed", "connection reset", "broken pipe"]
        .iter()
        .any(|w| detail.contains(w));
    match (&client, certificate_alert, closed) {
        (None, true, _) => said(
            "etcd refused the TLS connection: it requires a client certificate (its --client-cert-auth), and none is configured (--etcd-cert-file / --etcd-key-file)"
                .to_owned(),
        ),
        (None, false, true) => said(
            "etcd closed the TLS connection: it requires a client certificate (its --client-cert-auth), it seems, and none is configured (--etcd-cert-file / --etcd-key-file)"
                .to_owned(),
        ),
        (Some(cert), true, _) => said(format!(
            "etcd refused the client certificate in --etcd-cert-file {cert}: it is not signed by a CA etcd trusts (its --trusted-ca-file), or has expired"
        )),
        (Some(cert), false, true) => said(format!(
            "etcd closed the TLS connection: it refused the client certificate in --etcd-cert-file {cert}, it seems: not signed by a CA etcd trusts (its --trusted-ca-file), or expired"
        )),
        (_, false, _) if alert.is_some() => said("etcd ended the TLS handshake".to_owned()),
        _ => not_tls,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlock_common::tls::TlsFiles;

    fn io(text: &str) -> etcd_client::Error {
        etcd_client::Error::IoError(std::io::Error::other(text.to_owned()))
    }

    fn files(client: bool) -> EtcdTlsFiles {
        EtcdTlsFiles {
            ca: "/etc/etcd-ca.crt".into(),
            client: client.then(|| TlsFiles {
                cert: "/etc/client.crt".into(),
                key: "/etc/client.key".into(),
            }),
        }
    }

    fn at() -> Vec<String> {
        vec!["https://127.0.0.1:2379".to_owned()]
    }

    #[test]
    fn etcds_alerts_name_the_client_certificate_or_its_absence() {
        let alert = io("transport error: connection error: received fatal alert: BadCertificate");
        let with = explain(&alert, &at(), Some(&files(true)));
        assert!(with.tls, "{with:?}");
        assert!(
            with.message
                .contains("refused the client certificate in --etcd-cert-file /etc/client.crt")
                && with.message.contains("https://127.0.0.1:2379")
                && with.message.contains("BadCertificate"),
            "{with:?}"
        );
        let without = explain(&alert, &at(), Some(&files(false)));
        assert!(
            without.tls && without.message.contains("requires a client certificate"),
            "{without:?}"
        );
        // The close that won the race with the alert: the likely reason, said as such.
        let closed = explain(
            &io("operation was canceled: connection closed"),
            &at(),
            Some(&files(true)),
        );
        assert!(
            closed.tls && closed.message.contains("it seems") && closed.message.contains("/etc/client.crt"),
            "{closed:?}"
        );
    }

    #[test]
    fn an_etcd_that_is_not_there_is_not_a_tls_refusal() {
        let refused = io("tcp connect error: Connection refused (os error 111)");
        for tls in [None, Some(files(true))] {
            let e = explain(&refused, &at(), tls.as_ref());
            assert!(!e.tls && e.message.contains("does not answer"), "{e:?}");
        }
        // Without TLS a closed connection says nothing about certificates.
        let e = explain(&io("connection closed"), &at(), None);
        assert!(!e.tls, "{e:?}");
    }
}
