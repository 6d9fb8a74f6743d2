//! A `KubeProxyConfiguration` (`kubeproxy.config.k8s.io/v1alpha1`, as kubeadm writes it into
//! the kube-proxy ConfigMap's `config.conf`) read as an xlb configuration.
//!
//! [`map`] turns the document into the fields of an `XlbConfiguration` (a JSON object in
//! xlb's camelCase names) plus notes: every field with an xlb meaning is carried over, the
//! ones that only make sense for kube-proxy's iptables, ipvs, nftables or Windows backends (or
//! for kube-proxy the process) are accepted with one note each when they are set, and a field
//! kube-proxy does not know is an error naming it (kube-proxy decodes strictly too). As in
//! kube-proxy's defaulting, a zero value (`""`, `0`, `0s`, `null`, `false`) means "not set".
//! xlb-only settings (interfaces, cores, forwarding mode...) go in an optional
//! `XlbConfiguration` document in the same file (see [`crate::config`]).
//!
//! Sync periods: the top-level `syncPeriod`/`minSyncPeriod` if set, else those of the block of
//! `mode` (`iptables` by default, as kube-proxy). Timeouts: `conntrack.tcpEstablishedTimeout`
//! and `conntrack.udpTimeout`; in `mode: ipvs`, `ipvs.tcpTimeout`, `ipvs.tcpFinTimeout` and
//! `ipvs.udpTimeout` (what IPVS itself would use) where `conntrack` does not set them. API
//! client: `clientConnection.qps` and `clientConnection.burst` become xlb's
//! `clientConnection`, the token bucket of its Kubernetes client ([`crate::k8s::RateLimit`]).

use serde_json::{Map, Value, json};

/// The KubeProxyConfiguration's apiVersion.
pub const API_VERSION: &str = "kubeproxy.config.k8s.io/v1alpha1";
/// Its kind.
pub const KIND: &str = "KubeProxyConfiguration";

/// What [`map`] made of a KubeProxyConfiguration.
#[derive(Debug, Default)]
pub struct Mapped {
    /// XlbConfiguration fields (camelCase, nested blocks as objects).
    pub fields: Map<String, Value>,
    /// One note per field set that xlb does not use, and what it does instead.
    pub notes: Vec<String>,
}

/// A field the mapping refuses: its path (`conntrack.maxPerCore`) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// Field path in the KubeProxyConfiguration.
    pub field: String,
    /// Why.
    pub message: String,
}

fn err(field: &str, message: impl Into<String>) -> FieldError {
    FieldError { field: field.to_owned(), message: message.into() }
}

/// Whether `v` is kube-proxy's "not set": `null`, `""`, `0`, `false`, a zero duration, or an
/// object or list whose members are all unset.
fn unset(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => {
            let t = s.trim();
            t.is_empty() || crate::duration::parse_go_duration(t).is_ok_and(|d| d.is_zero())
        }
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.values().all(unset),
    }
}

/// Top-level fields, what xlb does with each: `Some(note)` for the ones it accepts without
/// using them; fields mapped by [`map`] itself are listed with `None`.
const TOP: &[(&str, Option<&str>)] = &[
    ("apiVersion", None),
    ("kind", None),
    ("bindAddress", Some("xlb's servers bind healthzBindAddress and metricsBindAddress")),
    ("bindAddressHardFail", Some("xlb always fails when it cannot bind its ports")),
    ("clientConnection", None),
    ("clusterCIDR", None),
    ("configSyncPeriod", Some("xlb's watches resync every syncPeriod")),
    ("conntrack", None),
    ("detectLocal", Some("xlb detects local traffic by clusterCIDR")),
    ("detectLocalMode", None),
    ("enableProfiling", Some("xlb serves no /debug/pprof")),
    ("featureGates", Some("kube-proxy's feature gates do not apply to xlb")),
    ("healthzBindAddress", None),
    ("hostnameOverride", None),
    ("iptables", None),
    ("ipvs", None),
    ("logging", Some("xlb logs through RUST_LOG")),
    ("metricsBindAddress", None),
    ("minSyncPeriod", None),
    ("mode", None),
    ("nftables", None),
    ("nodePortAddresses", None),
    ("oomScoreAdj", Some("set it on the DaemonSet or the systemd unit")),
    ("portRange", Some("kube-proxy's userspace-mode field")),
    ("showHiddenMetricsForVersion", Some("xlb has no hidden metrics")),
    ("syncPeriod", None),
    ("winkernel", Some("Windows only")),
];

/// Fields of the mode blocks xlb accepts without using them, with what it does instead.
const BLOCK_ONLY: &[(&str, &str)] = &[
    ("iptables.masqueradeBit", "xlb masquerades without packet marks"),
    ("iptables.localhostNodePorts", "xlb serves no NodePort on 127.0.0.1"),
    ("nftables.masqueradeBit", "xlb masquerades without packet marks"),
    ("ipvs.excludeCIDRs", "xlb owns only the VIPs of its tables"),
    ("ipvs.strictARP", "xlb never puts VIPs on a host interface"),
    ("conntrack.min", "xlb's flow table has a fixed capacity, conntrack.maxPerCore per worker"),
    ("conntrack.tcpCloseWaitTimeout", "xlb applies tcpFinTimeout to closing flows"),
    ("conntrack.tcpBeLiberal", "xlb tracks TCP states without window checks"),
    ("conntrack.udpStreamTimeout", "xlb has one UDP timeout"),
    ("clientConnection.acceptContentTypes", "xlb's API client asks for JSON"),
    ("clientConnection.contentType", "xlb's API client sends JSON"),
    ("clientConnection.kubeconfig", "pass the kubeconfig with `xlb run --kubeconfig PATH`"),
];

/// Known fields of each block (mapped or noted).
const BLOCKS: &[(&str, &[&str])] = &[
    ("clientConnection", &["acceptContentTypes", "burst", "contentType", "kubeconfig", "qps"]),
    (
        "conntrack",
        &[
            "maxPerCore",
            "min",
            "tcpBeLiberal",
            "tcpCloseWaitTimeout",
            "tcpEstablishedTimeout",
            "udpStreamTimeout",
            "udpTimeout",
        ],
    ),
    ("iptables", &["localhostNodePorts", "masqueradeAll", "masqueradeBit", "minSyncPeriod", "syncPeriod"]),
    ("nftables", &["masqueradeAll", "masqueradeBit", "minSyncPeriod", "syncPeriod"]),
    (
        "ipvs",
        &[
            "excludeCIDRs",
            "minSyncPeriod",
            "scheduler",
            "strictARP",
            "syncPeriod",
            "tcpFinTimeout",
            "tcpTimeout",
            "udpTimeout",
        ],
    ),
];

fn set<'a>(doc: &'a Map<String, Value>, path: &str) -> Option<&'a Value> {
    let mut parts = path.split('.');
    let first = doc.get(parts.next()?)?;
    let v = parts.try_fold(first, |v, p| v.get(p))?;
    (!unset(v)).then_some(v)
}

fn put(out: &mut Map<String, Value>, path: &str, v: Value) {
    match path.split_once('.') {
        Some((block, field)) => {
            let b = out.entry(block.to_owned()).or_insert_with(|| json!({}));
            if let Some(o) = b.as_object_mut() {
                o.insert(field.to_owned(), v);
            }
        }
        None => {
            out.insert(path.to_owned(), v);
        }
    }
}

/// A bind address: `IP:PORT` as is, a bare IP with kube-proxy's default port.
fn bind_address(field: &str, v: &Value, port: u16) -> Result<Value, FieldError> {
    let s = v.as_str().ok_or_else(|| err(field, "must be a string"))?.trim();
    if s.parse::<std::net::SocketAddr>().is_ok() {
        return Ok(json!(s));
    }
    match s.parse::<std::net::IpAddr>() {
        Ok(ip) => Ok(json!(std::net::SocketAddr::new(ip, port).to_string())),
        Err(_) => Err(err(field, format!("{s:?} is neither IP:PORT nor an IP address"))),
    }
}

/// Maps a KubeProxyConfiguration document (see the module docs).
///
/// # Errors
/// A field kube-proxy does not have (in a known block too), a block that is not a mapping,
/// an unknown `mode`, a bind address that is not one.
pub fn map(doc: &Map<String, Value>) -> Result<Mapped, FieldError> {
    let mut m = Mapped::default();
    for (k, v) in doc {
        let Some((_, note)) = TOP.iter().find(|(name, _)| name == k) else {
            return Err(err(k, format!("not a {KIND} field (kube-proxy would refuse it too)")));
        };
        if let Some(note) = note
            && !unset(v)
        {
            m.notes.push(format!("{KIND} {k}: accepted, not used ({note})"));
        }
        if let Some((_, fields)) = BLOCKS.iter().find(|(b, _)| b == k) {
            match v {
                Value::Null => {}
                Value::Object(o) => {
                    if let Some(f) = o.keys().find(|f| !fields.contains(&f.as_str())) {
                        return Err(err(&format!("{k}.{f}"), format!("not a {KIND} field")));
                    }
                }
                _ => return Err(err(k, "must be a mapping")),
            }
        }
    }
    for (path, note) in BLOCK_ONLY {
        if set(doc, path).is_some() {
            m.notes.push(format!("{KIND} {path}: accepted, not used ({note})"));
        }
    }
    let mode = set(doc, "mode").and_then(Value::as_str).unwrap_or("iptables").trim().to_owned();
    if !matches!(mode.as_str(), "iptables" | "ipvs" | "nftables") {
        return Err(err("mode", format!("{mode:?}: kube-proxy's modes are iptables, ipvs and nftables")));
    }
    if set(doc, "mode").is_some() {
        m.notes.push(format!(
            "{KIND} mode {mode}: xlb replaces kube-proxy's backends; the {mode} block's sync periods apply"
        ));
    }
    if let Some(v) = set(doc, "detectLocalMode")
        && v.as_str() != Some("ClusterCIDR")
    {
        m.notes
            .push(format!("{KIND} detectLocalMode {v}: accepted, not used (xlb detects local traffic by clusterCIDR)"));
    }
    let f = &mut m.fields;
    for (from, to) in [("hostnameOverride", "hostnameOverride"), ("clusterCIDR", "clusterCIDR")] {
        if let Some(v) = set(doc, from) {
            put(f, to, v.clone());
        }
    }
    if let Some(v) = set(doc, "nodePortAddresses") {
        put(f, "nodePortAddresses", v.clone());
    }
    if let Some(v) = set(doc, "healthzBindAddress") {
        put(f, "healthzBindAddress", bind_address("healthzBindAddress", v, 10256)?);
    }
    if let Some(v) = set(doc, "metricsBindAddress") {
        put(f, "metricsBindAddress", bind_address("metricsBindAddress", v, 10249)?);
    }
    for p in ["syncPeriod", "minSyncPeriod"] {
        if let Some(v) = set(doc, p).or_else(|| set(doc, &format!("{mode}.{p}"))) {
            put(f, p, v.clone());
        }
    }
    let masq = if mode == "nftables" { "nftables.masqueradeAll" } else { "iptables.masqueradeAll" };
    if let Some(v) = set(doc, masq) {
        put(f, "iptables.masqueradeAll", v.clone());
    }
    if let Some(v) = set(doc, "conntrack.maxPerCore") {
        put(f, "conntrack.maxPerCore", v.clone());
    }
    let ipvs = mode == "ipvs";
    for (ct, ipvs_field, xlb) in [
        ("conntrack.tcpEstablishedTimeout", "ipvs.tcpTimeout", "conntrack.tcpEstablishedTimeout"),
        ("", "ipvs.tcpFinTimeout", "conntrack.tcpFinTimeout"),
        ("conntrack.udpTimeout", "ipvs.udpTimeout", "conntrack.udpTimeout"),
    ] {
        let v =
            (!ct.is_empty()).then(|| set(doc, ct)).flatten().or_else(|| ipvs.then(|| set(doc, ipvs_field)).flatten());
        if let Some(v) = v {
            put(f, xlb, v.clone());
        }
    }
    if let Some(v) = set(doc, "ipvs.scheduler") {
        put(f, "ipvs.scheduler", v.clone());
    }
    // client-go's rate limit of the API client (0 = unset = client-go's default, as above).
    for p in ["clientConnection.qps", "clientConnection.burst"] {
        if let Some(v) = set(doc, p) {
            put(f, p, v.clone());
        }
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(yaml: &str) -> Map<String, Value> {
        serde_saphyr::from_str::<Value>(yaml).unwrap().as_object().unwrap().clone()
    }

    #[test]
    fn zero_values_are_unset_and_set_fields_carry_over_with_the_modes_periods() {
        let m = map(&doc(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: ipvs\n\
             clusterCIDR: 10.244.0.0/16\nmetricsBindAddress: 0.0.0.0\nhealthzBindAddress: \"\"\n\
             conntrack: {maxPerCore: null, tcpEstablishedTimeout: null, udpTimeout: 0s}\n\
             ipvs: {scheduler: rr, syncPeriod: 30s, minSyncPeriod: 2s, strictARP: true, tcpTimeout: 900s, tcpFinTimeout: 16s, udpTimeout: 300s}\n\
             iptables: {masqueradeAll: false, masqueradeBit: 14, minSyncPeriod: 1s, syncPeriod: 30s}\n",
        ))
        .unwrap();
        let f = Value::Object(m.fields);
        assert_eq!(f["clusterCIDR"], "10.244.0.0/16");
        assert_eq!(f["metricsBindAddress"], "0.0.0.0:10249");
        assert!(f.get("healthzBindAddress").is_none());
        assert_eq!((f["syncPeriod"].as_str(), f["minSyncPeriod"].as_str()), (Some("30s"), Some("2s")));
        assert_eq!(f["ipvs"]["scheduler"], "rr");
        assert_eq!(f["conntrack"]["tcpEstablishedTimeout"], "900s");
        assert_eq!(f["conntrack"]["tcpFinTimeout"], "16s");
        assert_eq!(f["conntrack"]["udpTimeout"], "300s");
        assert!(f.get("iptables").is_none(), "masqueradeAll false is unset");
        let notes = m.notes.join("\n");
        assert!(notes.contains("ipvs.strictARP: accepted, not used"), "{notes}");
        assert!(notes.contains("iptables.masqueradeBit: accepted, not used"), "{notes}");
        assert_eq!(m.notes.len(), 3, "strictARP, masqueradeBit, mode: {notes}");
    }

    #[test]
    fn client_connection_qps_and_burst_carry_over_zero_is_unset() {
        let m = map(&doc("kind: KubeProxyConfiguration\nclientConnection: {qps: 20.5, burst: 3, contentType: \"\"}\n"))
            .unwrap();
        let f = Value::Object(m.fields);
        assert_eq!(
            (f["clientConnection"]["qps"].as_f64(), f["clientConnection"]["burst"].as_i64()),
            (Some(20.5), Some(3))
        );
        assert!(m.notes.is_empty(), "{:?}", m.notes);
        let m = map(&doc("kind: KubeProxyConfiguration\nclientConnection: {qps: 0, burst: 0}\n")).unwrap();
        assert!(m.fields.get("clientConnection").is_none(), "{:?}", m.fields);
        let m = map(&doc("kind: KubeProxyConfiguration\nclientConnection: {qps: -1}\n")).unwrap();
        assert_eq!(Value::Object(m.fields)["clientConnection"]["qps"].as_f64(), Some(-1.0));
    }

    #[test]
    fn unknown_fields_and_modes_are_errors_naming_the_field() {
        let e = map(&doc("kind: KubeProxyConfiguration\nproxyMode: ipvs\n")).unwrap_err();
        assert_eq!(e.field, "proxyMode");
        let e = map(&doc("kind: KubeProxyConfiguration\nconntrack: {maxPercore: 1}\n")).unwrap_err();
        assert_eq!(e.field, "conntrack.maxPercore");
        let e = map(&doc("kind: KubeProxyConfiguration\nmode: userspace\n")).unwrap_err();
        assert_eq!(e.field, "mode");
        let e = map(&doc("kind: KubeProxyConfiguration\nmetricsBindAddress: everywhere\n")).unwrap_err();
        assert_eq!(e.field, "metricsBindAddress");
    }
}
