//! Runs the real `xlb` binary: `xlb check` on the example and on broken files.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name)
}

fn xlb(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xlb")).args(args).output().expect("xlb runs")
}

fn check(path: &Path) -> (i32, String, String) {
    let out = xlb(&["check", "--config", path.to_str().expect("utf-8 path")]);
    (
        out.status.code().expect("exit code"),
        String::from_utf8(out.stdout).expect("utf-8 stdout"),
        String::from_utf8(out.stderr).expect("utf-8 stderr"),
    )
}

/// A scratch file unique to this test process.
fn scratch(name: &str, text: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("xlb-check-{}-{name}", std::process::id()));
    std::fs::write(&p, text).expect("write scratch file");
    p
}

#[test]
fn check_prints_the_example_tables_like_ipvsadm() {
    let (code, stdout, stderr) = check(&data("example.yaml"));
    assert_eq!(code, 0, "stdout:\n{stdout}\nstderr:\n{stderr}");
    let want = "\
Prot LocalAddress:Port Scheduler Flags
  -> RemoteAddress:Port           Forward Weight State
TCP  10.96.0.1:443 random (default/kubernetes:https ClusterIP)
  -> 192.168.1.2:6443             Masq    1      ready
UDP  10.96.0.10:53 random persistent 10800 (kube-system/kube-dns:dns ClusterIP)
  -> 10.244.0.5:53                Masq    1      ready
  -> 10.244.1.7:53                Masq    1      ready
TCP  10.96.0.10:53 random persistent 10800 (kube-system/kube-dns:dns-tcp ClusterIP)
  -> 10.244.0.5:53                Masq    1      ready
  -> 10.244.1.7:53                Masq    1      ready
TCP  10.96.0.30:443 random (shop/checkout:https ClusterIP)
  -> 10.244.0.21:8443             Masq    1      ready
  -> 10.244.1.22:8443             Masq    1      ready
TCP  192.168.1.10:30443 random drop-when-empty (shop/checkout:https/external NodePort)
  -> 10.244.0.21:8443             Masq    1      ready
  -> 10.244.1.22:8443             Masq    0      ready
TCP  198.51.100.10:443 random drop-when-empty from 203.0.113.0/24 (shop/checkout:https/external LoadBalancer)
  -> 10.244.0.21:8443             Masq    1      ready
  -> 10.244.1.22:8443             Masq    0      ready
TCP  10.96.0.20:80 random (shop/web:http ClusterIP)
  -> 10.244.0.11:8080             Masq    1      ready
  -> 10.244.1.12:8080             Masq    0      draining
TCP  192.168.1.10:30080 random snat (shop/web:http NodePort)
  -> 10.244.0.11:8080             Masq    1      ready
  -> 10.244.1.12:8080             Masq    0      draining
TCP  [fd00:96::20]:80 random (shop/web:http/ipv6 ClusterIP)
  -> [fd00:244::11]:8080          Masq    1      ready
TCP  [fd00:1::10]:30080 random snat (shop/web:http/ipv6 NodePort)
  -> [fd00:244::11]:8080          Masq    1      ready
";
    assert_eq!(stdout, want, "stderr:\n{stderr}");
}

#[test]
fn check_on_a_bad_file_names_document_object_and_field() {
    let (code, stdout, stderr) = check(&data("bad.yaml"));
    assert_eq!(code, 1, "stderr:\n{stderr}");
    assert!(stdout.is_empty(), "nothing is printed for an unloadable file: {stdout}");
    assert!(stderr.contains("bad.yaml: 2 errors:"), "{stderr}");
    assert!(
        stderr.contains("document 1 (line 2), XlbConfiguration, field conntrack.udpTimout: unknown field `udpTimout`"),
        "{stderr}"
    );
    assert!(
        stderr
            .contains("document 2 (line 8), Service shop/web, field spec.ports[0].port: invalid type: string \"http\""),
        "{stderr}"
    );
}

#[test]
fn check_reports_a_skipped_service_and_still_prints_the_rest() {
    let text = "\
apiVersion: xlb.dev/v1alpha1
kind: XlbConfiguration
nodeName: node-a
---
apiVersion: v1
kind: Service
metadata: {name: broken, namespace: default}
spec: {clusterIP: 10.96.0.999, ports: [{name: http, port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: fine, namespace: default}
spec: {clusterIP: 10.96.0.7, ports: [{name: http, port: 80}]}
";
    let p = scratch("skipped.yaml", text);
    let (code, stdout, stderr) = check(&p);
    let _ = std::fs::remove_file(&p);
    assert_eq!(code, 1, "{stderr}");
    assert!(stdout.contains("TCP  10.96.0.7:80 random (default/fine:http ClusterIP)"), "{stdout}");
    assert!(!stdout.contains("broken"), "{stdout}");
    assert!(
        stderr.contains("error: Service default/broken, field spec.clusterIP: \"10.96.0.999\" is not an IP address"),
        "{stderr}"
    );
}

#[test]
fn check_on_a_missing_file_fails_with_the_path() {
    let (code, _, stderr) = check(Path::new("/nonexistent/xlb.yaml"));
    assert_eq!(code, 1);
    assert!(stderr.contains("cannot read /nonexistent/xlb.yaml"), "{stderr}");
}

#[test]
fn every_subcommand_has_help() {
    for sub in ["check", "run", "services", "conntrack", "stats"] {
        let out = xlb(&[sub, "--help"]);
        assert!(out.status.success(), "{sub} --help");
        assert!(String::from_utf8_lossy(&out.stdout).contains("Usage: xlb"), "{sub}");
    }
}

#[test]
fn admin_commands_without_a_running_xlb_fail_naming_the_socket() {
    for sub in ["services", "conntrack", "stats"] {
        let out = xlb(&[sub, "--admin-socket", "/nonexistent/xlb.sock"]);
        assert_eq!(out.status.code(), Some(1), "{sub}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("/nonexistent/xlb.sock") && err.contains("is xlb running?"), "{sub}: {err}");
    }
}

#[test]
fn run_without_config_is_a_usage_error() {
    let out = xlb(&["run"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--config"));
}

/// An xlb file with one `mh` Service whose endpoints are split over two EndpointSlices,
/// listed in the order `slices` gives (each slice's endpoints in the order given).
fn maglev_file(slices: &[(&str, &[&str])]) -> String {
    let mut text = String::from(
        "apiVersion: xlb.dev/v1alpha1\nkind: XlbConfiguration\nnodeName: node-a\nnodeAddresses: [192.168.1.10]\n\
         ipvs: {scheduler: mh}\ninterfaces: [{name: eth0, queues: [0]}]\ncores: [0]\n\
         neighbours: [{address: 10.244.0.1, mac: \"02:00:00:00:01:01\", port: eth0}]\n\
         routes: [{dst: 10.244.0.0/16, via: 10.244.0.1}]\n\
         ---\napiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop}\n\
         spec: {clusterIP: 10.96.0.20, clusterIPs: [10.96.0.20], ports: [{name: http, port: 80, protocol: TCP, targetPort: 8080}]}\n",
    );
    for (name, addrs) in slices {
        text.push_str(&format!(
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
             metadata: {{name: {name}, namespace: shop, labels: {{kubernetes.io/service-name: web}}}}\n\
             addressType: IPv4\nports: [{{name: http, port: 8080, protocol: TCP}}]\nendpoints:\n"
        ));
        for a in *addrs {
            text.push_str(&format!("- {{addresses: [{a}], conditions: {{ready: true}}}}\n"));
        }
    }
    text
}

/// The `xlb check` section that lists the Maglev tables.
fn maglev_section(stdout: &str) -> String {
    let at = stdout.find("Maglev Table").unwrap_or_else(|| panic!("no Maglev section in\n{stdout}"));
    stdout[at..].to_owned()
}

#[test]
fn separate_processes_given_the_same_endpoints_in_any_order_build_identical_maglev_tables() {
    // Every xlb node behind one ECMP group must send a flow to the same backend (issue 12):
    // two `xlb check` processes (each with its own randomly seeded hash maps) read the same
    // endpoints, listed in a different order and split differently over the slices.
    let a = scratch(
        "maglev-a.yaml",
        &maglev_file(&[
            ("web-1", &["10.244.0.11", "10.244.0.12", "10.244.0.13"]),
            ("web-2", &["10.244.1.21", "10.244.1.22"]),
        ]),
    );
    let b = scratch(
        "maglev-b.yaml",
        &maglev_file(&[
            ("web-9", &["10.244.1.22", "10.244.0.13"]),
            ("web-8", &["10.244.0.12", "10.244.1.21", "10.244.0.11"]),
        ]),
    );
    let fewer = scratch(
        "maglev-fewer.yaml",
        &maglev_file(&[("web-1", &["10.244.0.11", "10.244.0.12", "10.244.0.13"]), ("web-2", &["10.244.1.21"])]),
    );
    let (ca, out_a, err_a) = check(&a);
    let (cb, out_b, err_b) = check(&b);
    let (cf, out_f, err_f) = check(&fewer);
    for p in [&a, &b, &fewer] {
        let _ = std::fs::remove_file(p);
    }
    assert_eq!((ca, cb, cf), (0, 0, 0), "{err_a}\n{err_b}\n{err_f}");
    let (sa, sb, sf) = (maglev_section(&out_a), maglev_section(&out_b), maglev_section(&out_f));
    assert!(sa.contains("shop/web:http"), "{sa}");
    // 5 backends: M is the smallest listed prime >= 500 and >= maglevMinTableSize (1021).
    assert!(sa.lines().nth(1).is_some_and(|l| l.split_whitespace().nth(1) == Some("1021")), "{sa}");
    assert_eq!(sa, sb, "same endpoints, different order: the tables must be identical");
    assert_ne!(sa, sf, "one endpoint fewer must change the checksum");
}

#[test]
fn check_assigns_pool_addresses_to_the_address_pools_example() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples/address-pools.yaml");
    let (code, stdout, stderr) = check(&path);
    assert_eq!(code, 0, "stdout:\n{stdout}\nstderr:\n{stderr}");
    let lb: Vec<&str> = stdout.lines().filter(|l| l.ends_with(" LoadBalancer)")).collect();
    assert_eq!(
        lb,
        [
            "TCP  198.51.100.1:80 random snat (demo/dual:http LoadBalancer)",
            "TCP  [2001:db8:100::]:80 random snat (demo/dual:http/ipv6 LoadBalancer)",
            "UDP  192.0.2.50:53 random snat (demo/fixed:dns LoadBalancer)",
            "TCP  198.51.100.2:80 random snat (demo/web:http LoadBalancer)",
            "TCP  203.0.113.8:443 random snat (shop/checkout:https LoadBalancer)",
        ],
        "{stdout}"
    );
    assert!(
        stderr.contains("note: Service shop/checkout: LoadBalancer address 203.0.113.8 from pool \"shop\""),
        "{stderr}"
    );
    assert!(!stderr.contains("demo/elsewhere"), "another class is left alone: {stderr}");
}

/// `xlb check ... | head`: a reader that closed its end of the pipe before xlb wrote (here,
/// before xlb started) must not make xlb panic; it exits with the check's own code.
#[test]
fn check_into_a_closed_pipe_exits_with_its_code_without_a_panic() {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let out = Command::new(env!("CARGO_BIN_EXE_xlb"))
        .args(["check", "--config", data("example.yaml").to_str().expect("utf-8 path")])
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .expect("xlb runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "stderr:\n{stderr}");
    assert!(!stderr.contains("panicked") && !stderr.contains("error: writing"), "stderr:\n{stderr}");
}
