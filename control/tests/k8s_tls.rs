//! The Kubernetes client over HTTPS (ARCH-10: every node's API calls go to the API server
//! over HTTPS with client credentials): `xlb::k8s::client`, the function `xlb run
//! --kubeconfig` calls, against the fake API server served over TLS
//! (`FakeApiServer::start_tls`) with a certificate signed by a CA made for the test. The
//! kubeconfig names the CA's file (`certificate-authority`, as the in-cluster configuration
//! names `ca.crt`) and a bearer token (`token`, as a service account's). Certificates are
//! made at the start of each test (rcgen), never stored. The in-cluster form (a DaemonSet's
//! pod: no kubeconfig, the service account's files) runs in a child process with a mount
//! namespace of its own.

mod support;

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, ListParams};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use support::fake_apiserver::{FakeApiServer, Res, TlsIdentity};
use support::{NODE, TempDir, node, service, slice};
use xlb::http::Telemetry;
use xlb::k8s::{Source, SourceConfig};

const TOKEN: &str = "xlb-test-token";

/// A CA made for one test: its certificate in PEM, and its issuer for the server's.
struct Ca {
    pem: String,
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().expect("CA key")).expect("CA cert");
        Self { pem: issuer.pem(), issuer }
    }

    /// The server's identity: a certificate for 127.0.0.1 (IP subject alternative name, where
    /// the fake listens) signed by this CA, and the token the server requires.
    fn server_identity(&self) -> TlsIdentity {
        let key = KeyPair::generate().expect("server key");
        let mut params = CertificateParams::new(vec!["127.0.0.1".to_owned()]).expect("server params");
        params.distinguished_name.push(DnType::CommonName, "fake-apiserver");
        let cert = params.signed_by(&key, &self.issuer).expect("server cert");
        TlsIdentity {
            chain: vec![CertificateDer::from(cert.der().to_vec()), CertificateDer::from(self.issuer.der().to_vec())],
            key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            token: TOKEN.to_owned(),
        }
    }
}

/// A kubeconfig for `server` that trusts the CA in `ca_file` and, when `token` is given,
/// authenticates with it.
fn kubeconfig(server: &str, ca_file: &Path, token: Option<&str>) -> String {
    let user = token.map_or_else(|| "{}".to_owned(), |t| format!("{{token: \"{t}\"}}"));
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: tls\n  cluster:\n    server: \"{server}\"\n    certificate-authority: \"{}\"\ncontexts:\n- name: tls\n  context: {{cluster: tls, user: xlb}}\ncurrent-context: tls\nusers:\n- name: xlb\n  user: {user}\n",
        ca_file.display()
    )
}

/// An HTTPS fake API server with Service default/web, its slice and our Node; its
/// certificate is signed by `ca`.
async fn seeded_tls(ca: &Ca) -> FakeApiServer {
    let s = FakeApiServer::start_tls(ca.server_identity()).await;
    s.apply(Res::Services, service("default", "web", "10.96.0.10", &[("http", 80, 8080)]));
    s.apply(Res::EndpointSlices, slice("default", "web-abc", "web", &[("10.244.1.5", true, NODE)], &[("http", 8080)]));
    s.apply(Res::Nodes, node(NODE, "192.0.2.10"));
    s
}

/// The client `xlb run --kubeconfig` builds from the kubeconfig written into `dir`.
async fn client(dir: &TempDir, server: &FakeApiServer, ca: &Ca, token: Option<&str>) -> kube::Client {
    let ca_file = dir.write("ca.crt", &ca.pem);
    let kc = dir.write("kubeconfig.yaml", &kubeconfig(&server.url(), &ca_file, token));
    xlb::k8s::client(Some(&kc), &xlb::config::ClientConnectionConfig::default()).await.expect("client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_source_syncs_from_an_https_api_server_with_the_kubeconfigs_ca_and_token() {
    let ca = Ca::new("xlb test CA");
    let server = seeded_tls(&ca).await;
    assert!(server.url().starts_with("https://"), "{}", server.url());
    let dir = TempDir::new("tls-ok");
    let client = client(&dir, &server, &ca, Some(TOKEN)).await;
    let cfg = SourceConfig { min_sync_period: Duration::from_millis(50), ..SourceConfig::new(NODE) };
    let mut source = Source::start(client, cfg, Telemetry::new(Duration::from_secs(30)));
    let s = tokio::time::timeout(Duration::from_secs(10), source.next_snapshot()).await.expect("a snapshot in time");
    let state = s.state();
    let names: Vec<_> = state.services.iter().filter_map(|s| s.metadata.name.clone()).collect();
    assert_eq!(names, ["web"]);
    assert_eq!(state.endpoint_slices.len(), 1);
    assert_eq!(state.node.as_ref().and_then(|n| n.metadata.name.as_deref()), Some(NODE));
    // A change reaches the source through the TLS watch.
    server.apply(Res::Services, service("default", "db", "10.96.0.20", &[("pg", 5432, 5432)]));
    let end = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let s = tokio::time::timeout_at(end, source.next_snapshot()).await.expect("the change in time");
        if s.state().services.iter().any(|s| s.metadata.name.as_deref() == Some("db")) {
            break;
        }
    }
    assert_eq!(server.failed_handshakes(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_certificate_the_kubeconfigs_ca_did_not_sign_is_refused() {
    let (ca, other) = (Ca::new("xlb test CA"), Ca::new("another CA"));
    let server = seeded_tls(&ca).await;
    let dir = TempDir::new("tls-other-ca");
    let client = client(&dir, &server, &other, Some(TOKEN)).await;
    let err = Api::<Service>::all(client).list(&ListParams::default()).await.expect_err("the list must fail");
    // The client gave up in the handshake: the server saw it fail and served no request.
    let text = format!("{err:?}");
    assert!(text.contains("UnknownIssuer") || text.to_lowercase().contains("certificate"), "{text}");
    // The server's side of the handshake ends on its own task, after the client has given up:
    // waited for, 5 s at most.
    let end = tokio::time::Instant::now() + Duration::from_secs(5);
    while server.failed_handshakes() == 0 && tokio::time::Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(server.failed_handshakes() >= 1);
    assert_eq!(server.list_count(Res::Services), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_token_the_https_server_answers_401() {
    // What makes the first test's success say that the token was sent: the fake refuses a
    // client without it, after a handshake that succeeded.
    let ca = Ca::new("xlb test CA");
    let server = seeded_tls(&ca).await;
    let dir = TempDir::new("tls-no-token");
    let client = client(&dir, &server, &ca, None).await;
    let err = Api::<Service>::all(client).list(&ListParams::default()).await.expect_err("the list must fail");
    assert!(matches!(&err, kube::Error::Api(s) if s.code == 401), "{err:?}");
    assert_eq!(server.failed_handshakes(), 0);
    assert_eq!(server.list_count(Res::Services), 0);
}

/// Where kube (as client-go) reads a pod's service account (`kube::Config::incluster_env`).
const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The in-cluster form, as `xlb run` in a DaemonSet's pod uses it (no `--kubeconfig`):
/// `xlb::k8s::client(None, ..)` infers the server from `KUBERNETES_SERVICE_HOST` and
/// `KUBERNETES_SERVICE_PORT` and reads `ca.crt`, `token` and `namespace` from the service
/// account's directory. `in_cluster_child` runs in a child process (`unshare --mount`) whose
/// own tmpfs on `/var/run` holds those files, with no kubeconfig to find (`KUBECONFIG` unset,
/// `HOME` an empty directory); the host's `/var/run` is not touched. Needs root.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_cluster_the_client_reads_the_service_account_and_syncs_over_https() {
    if xlb_testkit::skip_without_root("in_cluster_the_client_reads_the_service_account_and_syncs_over_https") {
        return;
    }
    let ca = Ca::new("xlb test CA");
    let server = seeded_tls(&ca).await;
    let dir = TempDir::new("tls-in-cluster");
    dir.write("ca.crt", &ca.pem);
    dir.write("token", TOKEN);
    dir.write("namespace", "kube-system");
    let home = dir.0.join("home");
    std::fs::create_dir_all(&home).expect("empty home");
    let addr = server.addr();
    let exe = std::env::current_exe().expect("this test binary");
    let script = format!(
        "mount -t tmpfs xlb-test /var/run && mkdir -p {SERVICE_ACCOUNT_DIR} && cp \"$XLB_SA\"/ca.crt \"$XLB_SA\"/token \"$XLB_SA\"/namespace {SERVICE_ACCOUNT_DIR}/ && exec \"$@\""
    );
    let mut cmd = std::process::Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "sh", "-c", &script, "sh"])
        .arg(&exe)
        .args(["--exact", "in_cluster_child", "--ignored", "--nocapture", "--test-threads", "1"])
        .env_remove("KUBECONFIG")
        .env("HOME", &home)
        .env("XLB_SA", &dir.0)
        .env("KUBERNETES_SERVICE_HOST", addr.ip().to_string())
        .env("KUBERNETES_SERVICE_PORT", addr.port().to_string());
    let out = tokio::task::spawn_blocking(move || cmd.output()).await.expect("join").expect("run unshare");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the in-cluster child: {}\n{text}", out.status);
    assert!(text.contains("1 passed"), "the child test ran: {text}");
    // (Not checked: failed handshakes. The child exits with its watches open, and a connection
    // it was still opening then ends in the middle of its handshake.)
    assert!(server.list_count(Res::Services) >= 1, "the server served the child's list");
}

/// The child of `in_cluster_the_client_reads_the_service_account_and_syncs_over_https`, run
/// only by it (in its mount namespace, with its environment).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by in_cluster_the_client_reads_the_service_account_and_syncs_over_https in a mount namespace of its own"]
async fn in_cluster_child() {
    assert!(Path::new(SERVICE_ACCOUNT_DIR).join("token").is_file(), "the service account's token");
    let client =
        xlb::k8s::client(None, &xlb::config::ClientConnectionConfig::default()).await.expect("in-cluster client");
    let cfg = SourceConfig { min_sync_period: Duration::from_millis(50), ..SourceConfig::new(NODE) };
    let mut source = Source::start(client, cfg, Telemetry::new(Duration::from_secs(30)));
    let s = tokio::time::timeout(Duration::from_secs(10), source.next_snapshot()).await.expect("a snapshot in time");
    let names: Vec<_> = s.state().services.iter().filter_map(|s| s.metadata.name.clone()).collect();
    assert_eq!(names, ["web"]);
}
