//! Loads the generated kube-proxy rulesets into a scratch network namespace (needs root, as
//! CI runs; skipped with a message otherwise) and checks what the kernel holds.

use std::collections::BTreeMap;

use xlb_cpbench::iptables::{Family, iptables_ruleset};
use xlb_cpbench::netns::{ScratchNs, is_root};
use xlb_cpbench::nft::{nft_ruleset, nft_service_update};

const CONFIG: &str = r#"
apiVersion: xlb.dev/v1alpha1
kind: XlbConfiguration
nodeName: n1
nodeAddresses: [192.168.0.10, "fd00:192::10"]
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: ns}
spec: {clusterIP: 10.96.0.10, clusterIPs: [10.96.0.10], ports: [{name: http, port: 80, protocol: TCP, targetPort: 8080}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: ns, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- {addresses: [10.244.0.1], conditions: {ready: true}, nodeName: n2}
- {addresses: [EP2], conditions: {ready: true}, nodeName: n3}
---
apiVersion: v1
kind: Service
metadata: {name: np, namespace: ns}
spec: {type: NodePort, clusterIP: 10.96.0.11, clusterIPs: [10.96.0.11], ports: [{name: http, port: 80, protocol: TCP, targetPort: 8080, nodePort: 30080}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: np-1, namespace: ns, labels: {kubernetes.io/service-name: np}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- {addresses: [10.244.0.11], conditions: {ready: true}, nodeName: n2}
- {addresses: [10.244.0.12], conditions: {ready: true}, nodeName: n3}
- {addresses: [10.244.0.13], conditions: {ready: false}, nodeName: n3}
- {addresses: [10.244.0.14], conditions: {ready: true}, nodeName: n4}
---
apiVersion: v1
kind: Service
metadata: {name: lb, namespace: ns}
spec:
  type: LoadBalancer
  externalTrafficPolicy: Local
  loadBalancerSourceRanges: [10.0.0.0/8]
  clusterIP: 10.96.0.12
  clusterIPs: [10.96.0.12]
  ports: [{name: http, port: 80, protocol: TCP, targetPort: 8080, nodePort: 30081}]
status: {loadBalancer: {ingress: [{ip: 10.250.0.5}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: lb-1, namespace: ns, labels: {kubernetes.io/service-name: lb}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- {addresses: [10.244.0.21], conditions: {ready: true}, nodeName: n1}
- {addresses: [10.244.0.22], conditions: {ready: true}, nodeName: n2}
---
apiVersion: v1
kind: Service
metadata: {name: empty, namespace: ns}
spec: {clusterIP: 10.96.0.13, clusterIPs: [10.96.0.13], ports: [{name: http, port: 80, protocol: TCP}]}
---
apiVersion: v1
kind: Service
metadata: {name: sticky, namespace: ns}
spec: {clusterIP: 10.96.0.14, clusterIPs: [10.96.0.14], sessionAffinity: ClientIP, ports: [{name: http, port: 80, protocol: TCP, targetPort: 8080}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: sticky-1, namespace: ns, labels: {kubernetes.io/service-name: sticky}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- {addresses: [10.244.0.31], conditions: {ready: true}}
---
apiVersion: v1
kind: Service
metadata: {name: web6, namespace: ns}
spec: {clusterIP: "fd00:96::10", clusterIPs: ["fd00:96::10"], ipFamilies: [IPv6], ports: [{name: http, port: 80, protocol: TCP, targetPort: 8080}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web6-1, namespace: ns, labels: {kubernetes.io/service-name: web6}}
addressType: IPv6
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- {addresses: ["fd00:244::1"], conditions: {ready: true}}
- {addresses: ["fd00:244::2"], conditions: {ready: true}}
"#;

fn spec(ep2: &str) -> dataplane::tables::TablesSpec {
    let l = xlb::file_source::load_str(&CONFIG.replace("EP2", ep2), "test").unwrap();
    let (spec, report) = xlb::translate::build_spec(&l.cluster, &l.config).unwrap();
    assert!(!report.has_errors(), "{:?}", report.issues);
    spec
}

/// Chains of `table` in `nft list ruleset` output: per-service chains (their names contain a
/// `/`) counted by prefix up to the first `-`, the fixed chains by full name.
fn chain_counts(listing: &str, table: &str) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    let mut inside = false;
    for l in listing.lines() {
        let t = l.trim();
        if t.starts_with("table ") {
            inside = t == format!("table {table} {{");
        } else if inside && let Some(name) = t.strip_prefix("chain ").and_then(|r| r.strip_suffix(" {")) {
            let kind = if name.contains('/') { name.split('-').next().unwrap_or(name) } else { name };
            let kind = kind.to_owned();
            *out.entry(kind).or_default() += 1;
        }
    }
    out
}

/// A scratch directory removed on drop, also when an assertion fails.
struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn write(dir: &std::path::Path, name: &str, text: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn generated_rulesets_load_into_a_scratch_namespace() {
    if !is_root() {
        eprintln!(
            "SKIP generated_rulesets_load_into_a_scratch_namespace: needs root (ip netns, nft, iptables-restore)"
        );
        return;
    }
    let tmp = TempDir(std::env::temp_dir().join(format!("xlb-cpbench-test-{}", std::process::id())));
    std::fs::create_dir_all(&tmp.0).unwrap();
    let dir = tmp.0.clone();
    let before = spec("10.244.0.2");
    let ns = ScratchNs::new("cpbt").unwrap();

    // nftables.
    let full = write(&dir, "full.nft", &nft_ruleset(&before).unwrap());
    ns.nft_file(&full).unwrap();
    let listing = String::from_utf8(ns.exec("nft", &["list", "ruleset"]).unwrap().stdout).unwrap();
    let v4 = chain_counts(&listing, "ip kube-proxy");
    // web 2 + np 3 (one not ready) + lb 2 + sticky 1 endpoints.
    assert_eq!(v4.get("endpoint"), Some(&8), "{v4:?}");
    // web, np, lb (ClusterIP side), sticky.
    assert_eq!(v4.get("service"), Some(&4), "{v4:?}");
    assert_eq!(v4.get("local"), Some(&1), "lb's Local external policy: {v4:?}");
    assert_eq!(v4.get("external"), Some(&2), "np and lb: {v4:?}");
    assert_eq!(v4.get("firewall"), Some(&1), "lb's loadBalancerSourceRanges: {v4:?}");
    for base in [
        "nat-prerouting",
        "nat-output",
        "nat-postrouting",
        "filter-prerouting",
        "filter-input",
        "filter-forward",
        "filter-output",
        "filter-output-post-dnat",
        "services",
        "masquerading",
        "mark-for-masquerade",
        "service-endpoints-check",
        "nodeport-endpoints-check",
        "firewall-check",
        "cluster-ips-check",
        "reject-chain",
    ] {
        assert_eq!(v4.get(base), Some(&1), "{base}: {v4:?}");
    }
    assert_eq!(v4.len(), 16 + 5, "only the fixed chains and the five kinds of service chains: {v4:?}");
    assert_eq!(listing.matches("set affinity-").count(), 1, "sticky's one endpoint");
    let v6 = chain_counts(&listing, "ip6 kube-proxy");
    assert_eq!((v6.get("endpoint"), v6.get("service")), (Some(&2), Some(&1)), "{v6:?}");
    assert!(listing.contains("numgen random mod 2 vmap"), "web's two endpoints");
    assert!(listing.contains("masquerade fully-random"));
    assert!(listing.contains("10.96.0.13 . tcp . 80 comment \"ns/empty:http\" : goto reject-chain"), "{listing}");

    // One Service changes: web's second endpoint is replaced (kube-proxy's partial sync).
    let after = spec("10.244.0.9");
    let u = nft_service_update(&before, &after, "ns/web").unwrap();
    ns.nft_file(&write(&dir, "update.nft", &u.transaction)).unwrap();
    ns.nft_file(&write(&dir, "deferred.nft", &u.deferred)).unwrap();
    let listing = String::from_utf8(ns.exec("nft", &["list", "ruleset"]).unwrap().stdout).unwrap();
    assert!(listing.contains("dnat to 10.244.0.9:8080"), "{listing}");
    assert!(
        !listing.contains("__10.244.0.2/8080") && !listing.contains("10.244.0.2:8080"),
        "the replaced endpoint is gone"
    );
    assert_eq!(chain_counts(&listing, "ip kube-proxy").get("endpoint"), Some(&8));

    // iptables (both families).
    ns.exec_stdin("iptables-restore", &[], iptables_ruleset(&before, Family::V4).unwrap().as_bytes()).unwrap();
    ns.exec_stdin("ip6tables-restore", &[], iptables_ruleset(&before, Family::V6).unwrap().as_bytes()).unwrap();
    let nat = String::from_utf8(ns.exec("iptables-save", &["-t", "nat"]).unwrap().stdout).unwrap();
    let count = |s: &str, p: &str| s.lines().filter(|l| l.starts_with(p)).count();
    assert_eq!(count(&nat, ":KUBE-SEP-"), 8, "{nat}");
    assert_eq!(count(&nat, ":KUBE-SVC-"), 4, "{nat}");
    assert_eq!(count(&nat, ":KUBE-SVL-"), 1, "{nat}");
    assert_eq!(count(&nat, ":KUBE-EXT-"), 2, "{nat}");
    assert_eq!(count(&nat, ":KUBE-FW-"), 1, "{nat}");
    assert_eq!(nat.matches("-j DNAT --to-destination").count(), 8, "{nat}");
    let filter = String::from_utf8(ns.exec("iptables-save", &["-t", "filter"]).unwrap().stdout).unwrap();
    assert!(filter.contains("ns/empty:http has no endpoints") && filter.contains("-j REJECT"), "{filter}");
    let nat6 = String::from_utf8(ns.exec("ip6tables-save", &["-t", "nat"]).unwrap().stdout).unwrap();
    assert_eq!(count(&nat6, ":KUBE-SEP-"), 2, "{nat6}");
    drop(ns);
    drop(tmp);
}
