//! The Kubernetes manifests in `deploy/kubernetes/`, checked offline (no API server or kubectl
//! validation can run here):
//! - every object parses into its k8s-openapi type and serialises back to the same JSON.
//!   k8s-openapi ignores unknown fields, so a misspelt or misplaced field disappears in the
//!   round trip and the test names it;
//! - the RBAC reads exactly what xlb watches and writes only the Services' status
//!   subresource (patch, update) and, in its own namespace, Leases (get, list, watch,
//!   create, update, delete: the assigner's leader election and the L2 membership);
//! - the DaemonSet runs on the host network with kube-proxy's probe and metrics ports, the
//!   capabilities xlb needs and nothing more, and the API server's own address;
//! - its rolling update starts the new pod beside the old one, which hands over through the
//!   admin socket in a shared hostPath directory;
//! - the ConfigMap's `config.yaml` is a valid XlbConfiguration, also after the init container
//!   appends `nodeName`, and `xlb check` accepts it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Container, EnvVar, Namespace, PodSpec, Probe, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// The capabilities xlb's container gets (docs/operations.md explains each one).
const CAPABILITIES: [&str; 5] = ["NET_ADMIN", "NET_RAW", "BPF", "PERFMON", "IPC_LOCK"];

fn manifest_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes")
}

/// Every `*.yaml` file of the directory, sorted, kustomization.yaml included.
fn yaml_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(manifest_dir())
        .expect("deploy/kubernetes exists")
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    files
}

fn file_name(p: &Path) -> String {
    p.file_name().expect("a file name").to_string_lossy().into_owned()
}

/// One YAML document of a manifest file, as JSON.
struct Doc {
    /// `file.yaml#N` (1-based, empty documents not counted).
    place: String,
    value: Value,
}

impl Doc {
    fn str_field(&self, name: &str) -> &str {
        self.value.get(name).and_then(Value::as_str).unwrap_or_default()
    }
}

fn parse_documents(path: &Path) -> Vec<Doc> {
    let text = std::fs::read_to_string(path).expect("manifest is readable");
    // YAML 1.2 booleans, as xlb's own loader: `no` stays a string.
    let options = serde_saphyr::options! { strict_booleans: true };
    let values: Vec<Value> = serde_saphyr::from_multiple_with_options(&text, options)
        .unwrap_or_else(|e| panic!("{}: YAML syntax: {e}", path.display()));
    values
        .into_iter()
        .filter(|v| !v.is_null())
        .enumerate()
        .map(|(i, value)| Doc { place: format!("{}#{}", file_name(path), i + 1), value })
        .collect()
}

/// Every Kubernetes object of the directory (kustomization.yaml is kustomize's, not the API's).
fn objects() -> Vec<Doc> {
    let docs: Vec<Doc> =
        yaml_files().iter().filter(|p| file_name(p) != "kustomization.yaml").flat_map(|p| parse_documents(p)).collect();
    assert!(!docs.is_empty(), "no manifests in {}", manifest_dir().display());
    docs
}

/// The one object of `kind`, parsed into `T`.
fn one<T: DeserializeOwned>(kind: &str) -> T {
    let docs: Vec<Doc> = objects().into_iter().filter(|d| d.str_field("kind") == kind).collect();
    assert_eq!(docs.len(), 1, "want exactly one {kind} in deploy/kubernetes");
    serde_json::from_value(docs[0].value.clone()).unwrap_or_else(|e| panic!("{}: {kind}: {e}", docs[0].place))
}

/// Where `back` differs from `orig`: fields lost, added or changed, with their JSON paths.
fn differences(orig: &Value, back: &Value, path: &str, out: &mut Vec<String>) {
    match (orig, back) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, va) in a {
                let p = format!("{path}.{k}");
                match b.get(k) {
                    Some(vb) => differences(va, vb, &p, out),
                    None => out.push(format!("{p}: lost (unknown or misspelt field?)")),
                }
            }
            for k in b.keys().filter(|k| !a.contains_key(*k)) {
                out.push(format!("{path}.{k}: added by the round trip"));
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (va, vb)) in a.iter().zip(b).enumerate() {
                differences(va, vb, &format!("{path}[{i}]"), out);
            }
        }
        _ if orig == back => {}
        _ => out.push(format!("{path}: {orig} became {back}")),
    }
}

/// Parses `doc` into `T` and back; `Err` names every field that did not survive.
fn round_trip<T: DeserializeOwned + Serialize>(doc: &Doc) -> Result<(), String> {
    let typed: T = serde_path_to_error::deserialize(doc.value.clone())
        .map_err(|e| format!("{}: does not parse: field {}: {}", doc.place, e.path(), e.inner()))?;
    let back = serde_json::to_value(&typed).map_err(|e| format!("{}: does not serialise: {e}", doc.place))?;
    let mut diffs = Vec::new();
    differences(&doc.value, &back, "", &mut diffs);
    if diffs.is_empty() { Ok(()) } else { Err(format!("{}:\n    {}", doc.place, diffs.join("\n    "))) }
}

#[test]
fn every_manifest_round_trips_through_its_k8s_openapi_type_without_losing_a_field() {
    let mut failures = Vec::new();
    let mut kinds = BTreeSet::new();
    for doc in objects() {
        let (api_version, kind) = (doc.str_field("apiVersion"), doc.str_field("kind"));
        let result = match (api_version, kind) {
            ("v1", "Namespace") => round_trip::<Namespace>(&doc),
            ("v1", "ServiceAccount") => round_trip::<ServiceAccount>(&doc),
            ("v1", "ConfigMap") => round_trip::<ConfigMap>(&doc),
            ("apps/v1", "DaemonSet") => round_trip::<DaemonSet>(&doc),
            ("rbac.authorization.k8s.io/v1", "ClusterRole") => round_trip::<ClusterRole>(&doc),
            ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => round_trip::<ClusterRoleBinding>(&doc),
            ("rbac.authorization.k8s.io/v1", "Role") => round_trip::<Role>(&doc),
            ("rbac.authorization.k8s.io/v1", "RoleBinding") => round_trip::<RoleBinding>(&doc),
            ("apiextensions.k8s.io/v1", "CustomResourceDefinition") => round_trip::<CustomResourceDefinition>(&doc),
            _ => Err(format!("{}: {api_version}/{kind} has no k8s-openapi type in this test", doc.place)),
        };
        kinds.insert(kind.to_owned());
        if let Err(e) = result {
            failures.push(e);
        }
    }
    assert!(failures.is_empty(), "manifests that do not round-trip:\n  {}", failures.join("\n  "));
    for kind in ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet"] {
        assert!(kinds.contains(kind), "no {kind} in deploy/kubernetes (found {kinds:?})");
    }
}

#[test]
fn round_trip_check_catches_a_misspelt_field() {
    let value = serde_json::json!({
        "apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": "xlb", "namespace": "kube-system"},
        "automountServiceAcountToken": false,
    });
    let err = round_trip::<ServiceAccount>(&Doc { place: "inline#1".into(), value }).unwrap_err();
    assert!(err.contains(".automountServiceAcountToken: lost"), "{err}");
}

#[test]
fn lease_role_grants_the_lease_verbs_in_xlbs_namespace_only() {
    let role: Role = one("Role");
    let account: ServiceAccount = one("ServiceAccount");
    assert_eq!(role.metadata.namespace, account.metadata.namespace, "the Lease lives in xlb's namespace");
    // get, create, update: the address assigner's leader election and each node's L2
    // membership Lease; list, watch: the other nodes' membership Leases; delete: a node that
    // turns unhealthy or stops leaves at once. No patch: neither uses server-side apply.
    let want = set_of(&[("coordination.k8s.io", "leases", &["get", "list", "watch", "create", "update", "delete"])]);
    assert_eq!(grants(role.rules.as_deref().unwrap_or_default()), want);
    let binding: RoleBinding = one("RoleBinding");
    assert_eq!(binding.metadata.namespace, role.metadata.namespace);
    assert_eq!((binding.role_ref.kind.as_str(), Some(&binding.role_ref.name)), ("Role", role.metadata.name.as_ref()));
    let subjects = binding.subjects.unwrap_or_default();
    assert_eq!(subjects.len(), 1, "{subjects:?}");
    assert_eq!(
        (subjects[0].kind.as_str(), Some(&subjects[0].name)),
        ("ServiceAccount", account.metadata.name.as_ref())
    );
    assert_eq!(subjects[0].namespace, account.metadata.namespace);
    // The config's default Lease namespaces are the one the Role grants.
    let d = xlb::config::AddressAssignment::default();
    assert_eq!(Some(&d.lease_namespace), role.metadata.namespace.as_ref());
    let l2 = xlb::config::L2Config::default();
    assert_eq!(Some(&l2.lease_namespace), role.metadata.namespace.as_ref());
}

#[test]
fn checked_in_crd_is_the_one_xlb_generates() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(xlb::ipam::CRD_PATH);
    let checked_in = std::fs::read_to_string(&path).expect("the CRD file is checked in");
    let generated = xlb::ipam::crd_yaml().expect("the CRD serialises");
    assert!(
        checked_in == generated,
        "{} differs from `xlb crd`; regenerate it with: cargo run -p xlb -- crd > {}",
        path.display(),
        xlb::ipam::CRD_PATH
    );
    let crd: CustomResourceDefinition = one("CustomResourceDefinition");
    assert_eq!(crd.spec.scope, "Cluster");
    assert_eq!(crd.metadata.name.as_deref(), Some("xlbippools.xlb.dev"));
    let v = &crd.spec.versions;
    assert_eq!((v.len(), v[0].name.as_str(), v[0].served, v[0].storage), (1, "v1alpha1", true, true));
}

#[test]
fn kustomization_lists_exactly_the_manifest_files() {
    let path = manifest_dir().join("kustomization.yaml");
    let docs = parse_documents(&path);
    assert_eq!(docs.len(), 1, "kustomization.yaml holds one document");
    let listed: Vec<String> = docs[0].value["resources"]
        .as_array()
        .expect("kustomization.yaml has a resources list")
        .iter()
        .map(|r| r.as_str().expect("resources are file names").to_owned())
        .collect();
    let listed_set: BTreeSet<String> = listed.iter().cloned().collect();
    assert_eq!(listed_set.len(), listed.len(), "a resource is listed twice: {listed:?}");
    let files: BTreeSet<String> =
        yaml_files().iter().map(|p| file_name(p)).filter(|n| n != "kustomization.yaml").collect();
    assert_eq!(listed_set, files, "kustomization.yaml resources vs the manifest files beside it");
}

/// Every (apiGroup, resource, verb) a list of rules grants; rules naming resource names or
/// non-resource URLs fail the test.
fn grants(rules: &[PolicyRule]) -> BTreeSet<(String, String, String)> {
    let mut granted = BTreeSet::new();
    for rule in rules {
        assert!(rule.resource_names.is_none() && rule.non_resource_urls.is_none(), "unexpected rule shape: {rule:?}");
        for group in rule.api_groups.as_deref().unwrap_or_default() {
            for resource in rule.resources.as_deref().unwrap_or_default() {
                for verb in &rule.verbs {
                    granted.insert((group.clone(), resource.clone(), verb.clone()));
                }
            }
        }
    }
    granted
}

fn set_of(items: &[(&str, &str, &[&str])]) -> BTreeSet<(String, String, String)> {
    let mut want = BTreeSet::new();
    for (group, resource, verbs) in items {
        for verb in *verbs {
            want.insert(((*group).to_owned(), (*resource).to_owned(), (*verb).to_owned()));
        }
    }
    want
}

#[test]
fn cluster_role_reads_what_xlb_watches_and_writes_only_service_status() {
    let role: ClusterRole = one("ClusterRole");
    assert!(role.aggregation_rule.is_none(), "an aggregated role can grow beyond its rules");
    let read: &[&str] = &["get", "list", "watch"];
    let want = set_of(&[
        ("", "services", read),
        ("", "nodes", read),
        ("discovery.k8s.io", "endpointslices", read),
        ("xlb.dev", "xlbippools", read),
        ("", "services/status", &["patch", "update"]),
    ]);
    assert_eq!(grants(role.rules.as_deref().unwrap_or_default()), want);

    let binding: ClusterRoleBinding = one("ClusterRoleBinding");
    let account: ServiceAccount = one("ServiceAccount");
    assert_eq!(binding.role_ref.api_group, "rbac.authorization.k8s.io");
    assert_eq!(binding.role_ref.kind, "ClusterRole");
    assert_eq!(Some(&binding.role_ref.name), role.metadata.name.as_ref());
    let subjects = binding.subjects.unwrap_or_default();
    assert_eq!(subjects.len(), 1, "{subjects:?}");
    assert_eq!(subjects[0].kind, "ServiceAccount");
    assert_eq!(Some(&subjects[0].name), account.metadata.name.as_ref());
    assert_eq!(subjects[0].namespace, account.metadata.namespace);

    let ds: DaemonSet = one("DaemonSet");
    let pod = pod_spec(&ds);
    assert_eq!(pod.service_account_name, account.metadata.name, "the DaemonSet runs as the bound account");
    assert_eq!(ds.metadata.namespace, account.metadata.namespace);
}

fn pod_spec(ds: &DaemonSet) -> &PodSpec {
    ds.spec.as_ref().and_then(|s| s.template.spec.as_ref()).expect("DaemonSet has a pod spec")
}

fn xlb_container(pod: &PodSpec) -> &Container {
    let named: Vec<&Container> = pod.containers.iter().filter(|c| c.name == "xlb").collect();
    assert_eq!(named.len(), 1, "one container named xlb");
    assert_eq!(pod.containers.len(), 1, "xlb runs alone in its pod");
    named[0]
}

/// `(path, port)` of an HTTP GET probe.
fn http_get(probe: Option<&Probe>, which: &str) -> (String, i32) {
    let get = probe.and_then(|p| p.http_get.as_ref()).unwrap_or_else(|| panic!("{which} is an httpGet probe"));
    let port = match &get.port {
        IntOrString::Int(p) => *p,
        IntOrString::String(s) => panic!("{which} uses the named port {s}; use the number"),
    };
    (get.path.clone().unwrap_or_default(), port)
}

#[test]
fn daemonset_runs_on_the_host_network_with_probes_on_10256_and_metrics_on_10249() {
    let ds: DaemonSet = one("DaemonSet");
    let pod = pod_spec(&ds);
    assert_eq!(pod.host_network, Some(true));
    assert_eq!(pod.priority_class_name.as_deref(), Some("system-node-critical"));
    let tolerates_all =
        pod.tolerations.iter().flatten().any(|t| t.operator.as_deref() == Some("Exists") && t.key.is_none());
    assert!(tolerates_all, "a toleration with operator Exists and no key runs xlb on every node");

    let c = xlb_container(pod);
    assert_eq!(http_get(c.liveness_probe.as_ref(), "livenessProbe"), ("/livez".into(), 10256));
    assert_eq!(http_get(c.readiness_probe.as_ref(), "readinessProbe"), ("/healthz".into(), 10256));
    // (The ports are not declared as container ports: see the surge test below.)

    let annotations = ds.spec.as_ref().and_then(|s| s.template.metadata.as_ref()).and_then(|m| m.annotations.as_ref());
    let annotation = |k: &str| annotations.and_then(|a| a.get(k)).map(String::as_str);
    assert_eq!(annotation("prometheus.io/scrape"), Some("true"));
    assert_eq!(annotation("prometheus.io/port"), Some("10249"));

    // The probes and the scrape target are where the ConfigMap's config binds its servers.
    let config = configmap_config();
    assert_eq!(config.healthz_bind_address.port(), 10256);
    assert_eq!(config.metrics_bind_address.port(), 10249);
    // kube-proxy's default (127.0.0.1) is not scrapeable from the network: the shipped
    // ConfigMap must bind all addresses explicitly.
    assert!(config.metrics_bind_address.ip().is_unspecified(), "{}", config.metrics_bind_address);
}

#[test]
fn daemonset_container_gets_only_the_capabilities_xlb_needs() {
    let ds: DaemonSet = one("DaemonSet");
    let pod = pod_spec(&ds);
    assert_ne!(pod.host_pid, Some(true));
    assert_ne!(pod.host_ipc, Some(true));
    let c = xlb_container(pod);
    let sc = c.security_context.as_ref().expect("xlb has a securityContext");
    assert_eq!(sc.privileged, Some(false));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    let caps = sc.capabilities.as_ref().expect("capabilities are listed");
    assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_owned()][..]));
    let added: BTreeSet<&str> = caps.add.iter().flatten().map(String::as_str).collect();
    assert_eq!(added, CAPABILITIES.into_iter().collect(), "exactly the capabilities xlb uses");
    assert!(
        pod.init_containers.as_ref().is_none_or(Vec::is_empty),
        "no init containers: nothing else runs with the pod's volumes"
    );
}

/// ARCH-14: containerd's RuntimeDefault seccomp profile allows `bpf(2)` only with
/// CAP_SYS_ADMIN, which xlb does not get, so the container runs Unconfined (docs/operations.md,
/// "Capabilities"); without it xlb cannot create its maps. CFG-14: the DaemonSet lives where
/// kube-proxy's does, in `kube-system`.
#[test]
fn daemonset_runs_in_kube_system_with_a_seccomp_profile_that_allows_bpf() {
    let ds: DaemonSet = one("DaemonSet");
    assert_eq!(ds.metadata.namespace.as_deref(), Some("kube-system"));
    let pod = pod_spec(&ds);
    let c = xlb_container(pod);
    let profile = c
        .security_context
        .as_ref()
        .and_then(|sc| sc.seccomp_profile.as_ref())
        .or_else(|| pod.security_context.as_ref().and_then(|sc| sc.seccomp_profile.as_ref()))
        .expect("a seccompProfile is set: the runtime's default may refuse bpf(2)");
    assert!(
        profile.type_ == "Unconfined" || (profile.type_ == "Localhost" && profile.localhost_profile.is_some()),
        "seccompProfile {profile:?}: RuntimeDefault refuses bpf(2) without CAP_SYS_ADMIN"
    );
}

#[test]
fn daemonset_pod_is_guaranteed_qos_with_whole_cpus_for_the_workers() {
    let ds: DaemonSet = one("DaemonSet");
    let pod = pod_spec(&ds);
    // The kubelet's static CPU manager gives exclusive cores only to a Guaranteed pod's
    // containers with whole CPUs; init containers count for the QoS class too.
    for c in pod.init_containers.iter().flatten().chain(&pod.containers) {
        let r = c.resources.as_ref().unwrap_or_else(|| panic!("{} has resources", c.name));
        for resource in ["cpu", "memory"] {
            let request = r.requests.as_ref().and_then(|m| m.get(resource));
            let limit = r.limits.as_ref().and_then(|m| m.get(resource));
            assert!(
                request.is_some() && request == limit,
                "{}: {resource} request {request:?} limit {limit:?}",
                c.name
            );
        }
    }
    let c = xlb_container(pod);
    let cpu = c.resources.as_ref().and_then(|r| r.limits.as_ref()).and_then(|l| l.get("cpu")).expect("a CPU limit");
    let cores: u32 = cpu.0.parse().unwrap_or_else(|_| panic!("whole CPUs, not {:?}", cpu.0));
    let config = configmap_config();
    let queues = config.interfaces.iter().map(|i| i.queues.len().max(1)).min().unwrap_or(1);
    assert!(
        usize::try_from(cores).is_ok_and(|c| c > queues),
        "{cores} CPUs: one pinned worker per queue ({queues}) plus one for the control thread"
    );
}

fn env<'a>(c: &'a Container, name: &str) -> &'a EnvVar {
    c.env.iter().flatten().find(|e| e.name == name).unwrap_or_else(|| panic!("{} sets {name}", c.name))
}

#[test]
fn daemonset_reaches_the_api_server_directly_and_names_its_node() {
    let ds: DaemonSet = one("DaemonSet");
    let pod = pod_spec(&ds);
    let c = xlb_container(pod);
    let command: Vec<&str> = c.command.iter().flatten().chain(c.args.iter().flatten()).map(String::as_str).collect();
    assert_eq!(
        command,
        [
            "/usr/local/bin/xlb",
            "run",
            "--config",
            "/etc/xlb/config.yaml",
            "--kubernetes",
            "--takeover",
            "--after-handover=wait"
        ]
    );
    // ROLE-13: literal values, so the kubelet's Service-VIP values are overridden.
    let host = env(c, "KUBERNETES_SERVICE_HOST");
    assert!(host.value_from.is_none() && host.value.as_deref().is_some_and(|v| !v.is_empty()), "{host:?}");
    let port = env(c, "KUBERNETES_SERVICE_PORT");
    assert!(port.value.as_deref().is_some_and(|v| v.parse::<u16>().is_ok()), "{port:?}");
    // The node's name comes from the downward API, because the ConfigMap names no node.
    let node = env(c, "NODE_NAME").value_from.as_ref().and_then(|v| v.field_ref.as_ref());
    assert_eq!(node.map(|f| f.field_path.as_str()), Some("spec.nodeName"));
    assert_eq!(xlb::file_source::NODE_NAME_ENV, "NODE_NAME");

    // xlb reads config.yaml from the ConfigMap mounted at /etc/xlb.
    let configmap: ConfigMap = one("ConfigMap");
    let volumes: BTreeMap<&str, _> = pod.volumes.iter().flatten().map(|v| (v.name.as_str(), v)).collect();
    let m = c.volume_mounts.iter().flatten().find(|m| m.mount_path == "/etc/xlb").expect("xlb mounts /etc/xlb");
    let source = volumes[m.name.as_str()].config_map.as_ref().expect("a ConfigMap volume");
    assert_eq!(Some(&source.name), configmap.metadata.name.as_ref());
    for m in c.volume_mounts.iter().flatten() {
        assert!(volumes.contains_key(m.name.as_str()), "xlb mounts the undefined volume {}", m.name);
    }
}

/// The default of `xlb run --admin-socket`, from the binary's own help.
fn default_admin_socket() -> PathBuf {
    let out = Command::new(env!("CARGO_BIN_EXE_xlb")).args(["run", "--help"]).output().expect("xlb runs");
    let help = String::from_utf8_lossy(&out.stdout).into_owned();
    for flag in ["--admin-socket", "--takeover", "--after-handover"] {
        assert!(help.contains(flag), "`xlb run --help` lists no {flag}:\n{help}");
    }
    let after = help.split_once("--admin-socket").map(|(_, rest)| rest).unwrap_or_default();
    let default = after.split_once("[default: ").and_then(|(_, rest)| rest.split_once(']')).map(|(d, _)| d);
    PathBuf::from(default.unwrap_or_else(|| panic!("no default for --admin-socket in:\n{help}")))
}

#[test]
fn daemonset_updates_with_a_surge_pod_that_takes_over_through_the_shared_admin_socket_directory() {
    let ds: DaemonSet = one("DaemonSet");
    let spec = ds.spec.as_ref().expect("DaemonSet spec");
    let strategy = spec.update_strategy.as_ref().expect("an updateStrategy");
    assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));
    let rolling = strategy.rolling_update.as_ref().expect("rollingUpdate parameters");
    // The new pod starts while the old one serves (surge), and no node is left without xlb.
    assert_eq!(rolling.max_surge, Some(IntOrString::Int(1)), "{rolling:?}");
    assert_eq!(rolling.max_unavailable, Some(IntOrString::Int(0)), "{rolling:?}");
    // The new pod's readiness probe reaches whichever xlb serves the node's :10256, the old
    // one too: the old pod is deleted only after the new one has been ready for a while.
    assert!(spec.min_ready_seconds.is_some_and(|s| s > 0), "minReadySeconds: {:?}", spec.min_ready_seconds);

    let pod = pod_spec(&ds);
    let c = xlb_container(pod);
    let args: Vec<&str> = c.args.iter().flatten().map(String::as_str).collect();
    assert!(args.contains(&"--takeover"), "the new pod takes the old one's flows: {args:?}");
    // An old container that exited would be restarted (restartPolicy Always) and, with
    // --takeover, take the node back from the new pod.
    assert!(args.contains(&"--after-handover=wait"), "{args:?}");
    assert_ne!(pod.restart_policy.as_deref(), Some("Never"));

    // Both pods reach the same admin socket: its directory is the same host directory in both.
    let socket = args
        .iter()
        .position(|a| *a == "--admin-socket")
        .and_then(|i| args.get(i + 1))
        .map_or_else(default_admin_socket, PathBuf::from);
    let dir = socket.parent().expect("the socket is in a directory").to_str().expect("utf-8");
    let mount = c
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.mount_path.trim_end_matches('/') == dir)
        .unwrap_or_else(|| panic!("xlb mounts nothing at {dir}, the admin socket's directory"));
    assert_ne!(mount.read_only, Some(true), "xlb creates its socket in {dir}");
    let volume = pod.volumes.iter().flatten().find(|v| v.name == mount.name).expect("the mounted volume");
    let host = volume.host_path.as_ref().unwrap_or_else(|| panic!("{dir} is a hostPath: {volume:?}"));
    assert_eq!(host.path, dir, "the node's {dir}, so that `xlb services` works on the node too");
    assert_eq!(host.type_.as_deref(), Some("DirectoryOrCreate"));

    // A hostNetwork pod's container ports become hostPorts, and the scheduler does not place
    // two pods with the same hostPort on one node: the surge pod would stay Pending.
    for c in pod.init_containers.iter().flatten().chain(&pod.containers) {
        assert!(c.ports.as_ref().is_none_or(Vec::is_empty), "{} declares ports: {:?}", c.name, c.ports);
    }

    // The old xlb drains for shutdownGracePeriod after SIGTERM and may hand over at its end.
    let grace = configmap_config().shutdown_grace_period;
    let termination = pod.termination_grace_period_seconds.expect("terminationGracePeriodSeconds");
    assert!(
        u64::try_from(termination).is_ok_and(|t| t > grace.as_secs()),
        "terminationGracePeriodSeconds {termination} must exceed shutdownGracePeriod {grace:?}"
    );
}

/// The ConfigMap's `config.yaml` text.
fn configmap_text() -> String {
    let configmap: ConfigMap = one("ConfigMap");
    configmap.data.and_then(|d| d.get("config.yaml").cloned()).expect("the ConfigMap has the key config.yaml")
}

fn configmap_config() -> xlb::config::Config {
    match xlb::file_source::load_str(&configmap_text(), "configmap.yaml:config.yaml") {
        Ok(l) => l.config,
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn configmap_config_yaml_loads_as_an_xlb_configuration_and_takes_the_node_name_from_the_environment() {
    let text = configmap_text();
    let loaded = xlb::file_source::load_str(&text, "config.yaml").unwrap_or_else(|e| panic!("{e}"));
    assert!(loaded.notes.is_empty(), "{:?}", loaded.notes);
    assert!(loaded.cluster.services.is_empty() && loaded.cluster.endpoint_slices.is_empty(), "only the config");
    assert_eq!(loaded.config.node_name(), None, "the node name comes from $NODE_NAME");
    assert!(!loaded.config.interfaces.is_empty(), "`xlb run` needs an interface");

    // What xlb does with the DaemonSet's NODE_NAME.
    let loaded =
        xlb::file_source::load_str_for_node(&text, "config.yaml", Some("node-a")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(loaded.config.node_name(), Some("node-a"));
}

#[test]
fn configmap_config_yaml_passes_xlb_check() {
    let path = std::env::temp_dir().join(format!("xlb-manifests-{}-config.yaml", std::process::id()));
    std::fs::write(&path, configmap_text()).expect("write the extracted config");
    let out = Command::new(env!("CARGO_BIN_EXE_xlb"))
        .args(["check", "--config", path.to_str().expect("utf-8 path")])
        .output()
        .expect("xlb runs");
    let _ = std::fs::remove_file(&path);
    assert!(
        out.status.success(),
        "xlb check: {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn configmap_sets_the_cluster_cidr() {
    // NAT-06: without clusterCIDR, ClusterIP traffic from outside the pod network would keep
    // its client IP and its replies would bypass xlb.
    assert!(!configmap_config().cluster_cidr.is_empty(), "the ConfigMap must set clusterCIDR");
}

/// `xlb check` on one file: (success, stderr).
fn xlb_check(path: &Path) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_xlb"))
        .args(["check", "--config", path.to_str().expect("utf-8 path")])
        .output()
        .expect("xlb runs");
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn every_example_passes_xlb_check() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).expect("deploy/examples exists") {
        let p = e.expect("directory entry").path();
        if p.extension().is_some_and(|x| x == "yaml") {
            let (ok, stderr) = xlb_check(&p);
            assert!(ok, "xlb check {}: {stderr}", p.display());
            n += 1;
        }
    }
    assert!(n >= 2, "only {n} examples found in {}", dir.display());
}

#[test]
fn routed_pod_network_example_reaches_every_backend_through_its_routes() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples/routed-pod-network.yaml");
    let (ok, stderr) = xlb_check(&path);
    assert!(ok, "{stderr}");
    assert!(!stderr.contains("no next hop"), "a backend has no next hop: {stderr}");
    // The check can fail: the same file without its routes leaves the pods without a next hop.
    let text = std::fs::read_to_string(&path).expect("read the example");
    let without: String = text.lines().filter(|l| !l.starts_with("- {dst: ")).map(|l| format!("{l}\n")).collect();
    let tmp = std::env::temp_dir().join(format!("xlb-routed-{}.yaml", std::process::id()));
    std::fs::write(&tmp, without.replace("routes:\n", "routes: []\n")).expect("write");
    let (ok, stderr) = xlb_check(&tmp);
    let _ = std::fs::remove_file(&tmp);
    assert!(ok, "{stderr}");
    assert!(stderr.contains("no next hop in the config for backend(s) 10.244.1.7, 10.244.2.9"), "{stderr}");
}
