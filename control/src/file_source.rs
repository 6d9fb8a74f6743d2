//! The file source: reads a standalone config file and gives the configuration and the
//! Kubernetes objects it carries, as the Kubernetes source ([`crate::k8s`]) gives those of
//! the API server.
//!
//! A config FILE (for `xlb run --config FILE` and `xlb check --config FILE`) holds:
//! - exactly one `apiVersion: xlb.dev/v1alpha1`, `kind: XlbConfiguration` document
//!   ([`Config`]; its schema and validation are [`crate::config`]) and/or one
//!   KubeProxyConfiguration ([`crate::kubeproxy`]);
//! - any number of `v1/Service`, `discovery.k8s.io/v1/EndpointSlice` and `v1/Node` objects
//!   exactly as `kubectl get -o yaml` prints them, also wrapped in a `kind: List` with `items`.
//!
//! Unknown fields in the xlb document are errors naming the field; Kubernetes objects are
//! parsed into k8s-openapi types (which ignore unknown fields, as the API server's clients do).
//! Every error names the document (1-based, empty documents not counted, plus the line it
//! starts on), the object (`Service default/web`) and the field path (`spec.ports[0].port`).
//! All errors of a file are collected, not just the first.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

use crate::cluster::ClusterState;
use crate::config::{API_VERSION, Config, KIND};

/// A loaded and validated config file.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The xlb configuration.
    pub config: Config,
    /// The Kubernetes objects (Services, EndpointSlices, and this node's Node).
    pub cluster: ClusterState,
    /// Notes about what the loader did (e.g. Node objects ignored because they are not ours).
    pub notes: Vec<String>,
}

/// Where an error is: which document of the file, which item of a `List`, which object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocError {
    /// Document number, 1-based, empty documents not counted.
    pub document: usize,
    /// Line (1-based) where the document's content starts, or of the YAML error.
    pub line: usize,
    /// Index into `items` when the object is inside a `kind: List`.
    pub item: Option<usize>,
    /// The object, e.g. `Service default/web`, when known.
    pub object: Option<String>,
    /// The field path, e.g. `spec.ports[0].port`, when known.
    pub field: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for DocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "document {} (line {})", self.document, self.line)?;
        if let Some(i) = self.item {
            write!(f, ", items[{i}]")?;
        }
        if let Some(o) = &self.object {
            write!(f, ", {o}")?;
        }
        if let Some(p) = &self.field {
            write!(f, ", field {p}")?;
        }
        write!(f, ": {}", self.message)
    }
}

/// Why a config file could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read.
    #[error("cannot read {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// One or more documents are invalid.
    #[error("{source_name}: {}", render_doc_errors(.errors))]
    Invalid {
        /// File name (or `<input>`).
        source_name: String,
        /// Every error found, in document order.
        errors: Vec<DocError>,
    },
}

fn render_doc_errors(errors: &[DocError]) -> String {
    match errors {
        [one] => one.to_string(),
        many => {
            let mut s = format!("{} errors:", many.len());
            for e in many {
                s.push_str("\n  ");
                s.push_str(&e.to_string());
            }
            s
        }
    }
}

/// Reads and loads a config file.
///
/// # Errors
/// [`LoadError`] naming the file, document, object and field of every problem.
pub fn load_file(path: &Path) -> Result<Loaded, LoadError> {
    load_file_for_node(path, None)
}

/// Environment variable that names this node when the file sets neither `nodeName` nor
/// `hostnameOverride`. The DaemonSet sets it from the downward API (`spec.nodeName`), so one
/// ConfigMap serves every node.
pub const NODE_NAME_ENV: &str = "NODE_NAME";

/// [`load_file`], with `fallback_node_name` (the value of [`NODE_NAME_ENV`], if set) used as
/// `nodeName` when the file names no node. An empty or blank fallback counts as unset.
///
/// # Errors
/// As [`load_file`].
pub fn load_file_for_node(path: &Path, fallback_node_name: Option<&str>) -> Result<Loaded, LoadError> {
    let text = std::fs::read_to_string(path).map_err(|source| LoadError::Read { path: path.to_owned(), source })?;
    load_str_for_node(&text, &path.display().to_string(), fallback_node_name)
}

/// One YAML document cut out of a multi-document file.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RawDoc<'a> {
    /// Text, including a leading `---` line if there was one.
    text: &'a str,
    /// Line number (1-based) of the first line of `text`.
    first_line: usize,
    /// Line number of the first content line (not blank, not a comment, not a marker).
    content_line: usize,
}

fn is_doc_start(line: &str) -> bool {
    line == "---" || line.starts_with("--- ") || line.starts_with("---\t")
}

fn is_doc_end(line: &str) -> bool {
    line == "..." || line.starts_with("... ") || line.starts_with("...\t")
}

/// Splits YAML text at document markers (`---` and `...` at column 0, which YAML forbids
/// inside any scalar) and drops documents that hold only blank lines, comments and directives.
fn split_documents(text: &str) -> Vec<RawDoc<'_>> {
    let mut docs = Vec::new();
    let mut start = 0usize;
    let mut first_line = 1usize;
    let mut offset = 0usize;
    fn push<'a>(text: &'a str, from: usize, to: usize, first_line: usize, docs: &mut Vec<RawDoc<'a>>) {
        let chunk = &text[from..to];
        let content = chunk.lines().enumerate().find(|(_, l)| {
            let t = l.trim();
            !(t.is_empty() || t.starts_with('#') || l.starts_with('%') || is_doc_start(l.trim_end()))
        });
        let marker_content = chunk.lines().next().is_some_and(|l| {
            let rest = l.get(3..).unwrap_or("").trim();
            is_doc_start(l.trim_end()) && !rest.is_empty() && !rest.starts_with('#')
        });
        match content {
            Some((i, _)) => docs.push(RawDoc { text: chunk, first_line, content_line: first_line + i }),
            None if marker_content => docs.push(RawDoc { text: chunk, first_line, content_line: first_line }),
            None => {}
        }
    }
    for (i, line) in text.split_inclusive('\n').enumerate() {
        let bare = line.trim_end_matches(['\n', '\r']);
        if is_doc_start(bare) {
            push(text, start, offset, first_line, &mut docs);
            start = offset;
            first_line = i + 1;
        } else if is_doc_end(bare) {
            push(text, start, offset, first_line, &mut docs);
            start = offset + line.len();
            first_line = i + 2;
        }
        offset += line.len();
    }
    push(text, start, text.len(), first_line, &mut docs);
    docs
}

/// Builds the object label used in errors (`Service default/web`) from untyped YAML.
fn object_label(kind: &str, v: &serde_json::Value, namespaced: bool) -> String {
    let meta = v.get("metadata");
    let name = meta.and_then(|m| m.get("name")).and_then(|n| n.as_str()).unwrap_or("<unnamed>");
    if namespaced {
        let ns = meta.and_then(|m| m.get("namespace")).and_then(|n| n.as_str()).unwrap_or("default");
        format!("{kind} {ns}/{name}")
    } else {
        format!("{kind} {name}")
    }
}

/// Parses one typed object, reporting the field path of a failure.
fn parse_typed<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> Result<T, (String, String)> {
    serde_path_to_error::deserialize::<_, T>(v).map_err(|e| {
        let path = e.path().to_string();
        (path, e.into_inner().to_string())
    })
}

#[derive(Default)]
struct Collector {
    config: Option<(Config, usize)>,
    /// The XlbConfiguration document, parsed by [`Collector::settle`] (it may extend a
    /// KubeProxyConfiguration).
    xlb_raw: Option<(serde_json::Map<String, serde_json::Value>, Here)>,
    /// A KubeProxyConfiguration document, mapped ([`crate::kubeproxy`]).
    kpc: Option<(crate::kubeproxy::Mapped, Here)>,
    services: Vec<Service>,
    slices: Vec<EndpointSlice>,
    nodes: Vec<Node>,
    seen: BTreeMap<String, String>,
    errors: Vec<DocError>,
}

#[derive(Clone, Copy)]
struct Here {
    document: usize,
    line: usize,
    item: Option<usize>,
}

impl Here {
    fn err(self, object: Option<String>, field: Option<String>, message: impl Into<String>) -> DocError {
        DocError { document: self.document, line: self.line, item: self.item, object, field, message: message.into() }
    }
    fn describe(self) -> String {
        match self.item {
            Some(i) => format!("document {} items[{i}]", self.document),
            None => format!("document {}", self.document),
        }
    }
}

impl Collector {
    /// Turns the configuration documents into [`Collector::config`]: the XlbConfiguration
    /// alone, the KubeProxyConfiguration alone, or the XlbConfiguration's fields over the
    /// KubeProxyConfiguration's (a field set by both is an error naming it). Returns the
    /// KubeProxyConfiguration's notes.
    fn settle(&mut self) -> Vec<String> {
        use serde_json::Value;
        let kpc_kind = crate::kubeproxy::KIND;
        let (fields, here, label, notes) = match (self.kpc.take(), self.xlb_raw.take()) {
            (None, None) => return Vec::new(),
            (Some((m, h)), None) => (m.fields, h, kpc_kind, m.notes),
            (None, Some((x, h))) => (x, h, KIND, Vec::new()),
            (Some((m, hk)), Some((x, hx))) => {
                let mut base = m.fields;
                for (k, v) in x {
                    match (base.get_mut(&k), v) {
                        (None, v) => {
                            base.insert(k, v);
                        }
                        (Some(Value::Object(b)), Value::Object(o)) => {
                            for (f, fv) in o {
                                if b.contains_key(&f) {
                                    self.errors.push(hx.err(
                                        Some(KIND.to_owned()),
                                        Some(format!("{k}.{f}")),
                                        format!("also set by the {kpc_kind} (document {})", hk.document),
                                    ));
                                }
                                b.insert(f, fv);
                            }
                        }
                        (Some(_), _) => self.errors.push(hx.err(
                            Some(KIND.to_owned()),
                            Some(k.clone()),
                            format!("also set by the {kpc_kind} (document {})", hk.document),
                        )),
                    }
                }
                (base, hx, KIND, m.notes)
            }
        };
        match parse_typed::<Config>(Value::Object(fields)) {
            Err((path, msg)) => self.errors.push(here.err(Some(label.to_owned()), Some(path), msg)),
            Ok(c) => match c.validate() {
                Err(e) => self.errors.push(here.err(Some(label.to_owned()), Some(e.field), e.message)),
                Ok(()) => self.config = Some((c, here.document)),
            },
        }
        notes
    }

    fn object(&mut self, v: serde_json::Value, here: Here) {
        let serde_json::Value::Object(mut map) = v else {
            self.errors.push(here.err(
                None,
                None,
                "expected a mapping with apiVersion and kind (an xlb configuration or a Kubernetes object)",
            ));
            return;
        };
        let api_version = map.get("apiVersion").and_then(|x| x.as_str()).map(str::to_owned);
        let kind = map.get("kind").and_then(|x| x.as_str()).map(str::to_owned);
        let (Some(api_version), Some(kind)) = (api_version, kind) else {
            let missing = if map.get("apiVersion").and_then(|x| x.as_str()).is_none() { "apiVersion" } else { "kind" };
            self.errors.push(here.err(None, Some(missing.into()), "missing or not a string"));
            return;
        };
        let expected_api = match kind.as_str() {
            KIND => Some(API_VERSION),
            crate::kubeproxy::KIND => Some(crate::kubeproxy::API_VERSION),
            "Service" | "Node" | "List" => Some("v1"),
            "EndpointSlice" => Some("discovery.k8s.io/v1"),
            _ => None,
        };
        match expected_api {
            None => {
                self.errors.push(here.err(
                    None,
                    Some("kind".into()),
                    format!(
                        "unsupported kind {kind:?} (apiVersion {api_version:?}); a config file holds one {KIND} and/or one KubeProxyConfiguration, and Service, EndpointSlice, Node or List objects"
                    ),
                ));
                return;
            }
            Some(want) if want != api_version => {
                self.errors.push(here.err(
                    None,
                    Some("apiVersion".into()),
                    format!("{api_version:?} is not supported for kind {kind}; use {want:?}"),
                ));
                return;
            }
            Some(_) => {}
        }
        let v = serde_json::Value::Object(map.clone());
        match kind.as_str() {
            KIND => {
                map.remove("apiVersion");
                map.remove("kind");
                if let Some((_, first)) = &self.xlb_raw {
                    self.errors.push(here.err(
                        Some(KIND.to_owned()),
                        None,
                        format!("a second {KIND} document; the first is document {}", first.document),
                    ));
                } else {
                    self.xlb_raw = Some((map, here));
                }
            }
            crate::kubeproxy::KIND => {
                let label = crate::kubeproxy::KIND.to_owned();
                match crate::kubeproxy::map(&map) {
                    Err(e) => self.errors.push(here.err(Some(label), Some(e.field), e.message)),
                    Ok(_) if self.kpc.is_some() => {
                        let first = self.kpc.as_ref().map_or(0, |(_, h)| h.document);
                        self.errors.push(here.err(
                            Some(label.clone()),
                            None,
                            format!("a second {label} document; the first is document {first}"),
                        ));
                    }
                    Ok(m) => self.kpc = Some((m, here)),
                }
            }
            "List" => {
                if here.item.is_some() {
                    self.errors.push(here.err(None, Some("kind".into()), "a List inside a List is not supported"));
                    return;
                }
                match map.remove("items") {
                    Some(serde_json::Value::Array(items)) => {
                        for (i, it) in items.into_iter().enumerate() {
                            self.object(it, Here { item: Some(i), ..here });
                        }
                    }
                    Some(serde_json::Value::Null) | None => {}
                    Some(_) => self.errors.push(here.err(Some("List".into()), Some("items".into()), "must be a list")),
                }
            }
            "Service" => {
                let label = object_label("Service", &v, true);
                match parse_typed::<Service>(v) {
                    Err((path, msg)) => self.errors.push(here.err(Some(label), Some(path), msg)),
                    Ok(mut s) => {
                        if self.identify(&mut s.metadata, true, &label, here) {
                            self.services.push(s);
                        }
                    }
                }
            }
            "EndpointSlice" => {
                let label = object_label("EndpointSlice", &v, true);
                match parse_typed::<EndpointSlice>(v) {
                    Err((path, msg)) => self.errors.push(here.err(Some(label), Some(path), msg)),
                    Ok(mut s) => {
                        if !matches!(s.address_type.as_str(), "IPv4" | "IPv6" | "FQDN") {
                            self.errors.push(here.err(
                                Some(label),
                                Some("addressType".into()),
                                format!("{:?} is not IPv4, IPv6 or FQDN", s.address_type),
                            ));
                        } else if self.identify(&mut s.metadata, true, &label, here) {
                            self.slices.push(s);
                        }
                    }
                }
            }
            "Node" => {
                let label = object_label("Node", &v, false);
                match parse_typed::<Node>(v) {
                    Err((path, msg)) => self.errors.push(here.err(Some(label), Some(path), msg)),
                    Ok(mut n) => {
                        if self.identify(&mut n.metadata, false, &label, here) {
                            self.nodes.push(n);
                        }
                    }
                }
            }
            _ => unreachable!("kinds were filtered above"),
        }
    }

    /// Checks the name, defaults the namespace to `default` (as `kubectl apply` does) and
    /// rejects a second object of the same kind and name.
    fn identify(
        &mut self,
        meta: &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
        namespaced: bool,
        label: &str,
        here: Here,
    ) -> bool {
        if meta.name.as_deref().is_none_or(|n| n.trim().is_empty()) {
            self.errors.push(here.err(Some(label.to_owned()), Some("metadata.name".into()), "missing"));
            return false;
        }
        if namespaced && meta.namespace.as_deref().is_none_or(str::is_empty) {
            meta.namespace = Some("default".into());
        }
        if let Some(first) = self.seen.insert(label.to_owned(), here.describe()) {
            self.errors.push(here.err(
                Some(label.to_owned()),
                Some("metadata.name".into()),
                format!("the same object is already defined in {first}"),
            ));
            self.seen.insert(label.to_owned(), first);
            return false;
        }
        true
    }
}

/// Loads config-file text (see the module docs). `source_name` names the file in errors.
///
/// # Errors
/// [`LoadError::Invalid`] with every problem found.
pub fn load_str(text: &str, source_name: &str) -> Result<Loaded, LoadError> {
    load_str_for_node(text, source_name, None)
}

/// [`load_str`] with a fallback node name (see [`load_file_for_node`]). The fallback is
/// applied before this node's Node object is picked out of the documents.
///
/// # Errors
/// As [`load_str`].
pub fn load_str_for_node(text: &str, source_name: &str, fallback_node_name: Option<&str>) -> Result<Loaded, LoadError> {
    load_str_after(text, source_name, fallback_node_name, None)
}

/// [`load_file_for_node`] for a reload: `previous` is the cluster state built from the file
/// before, whose pool addresses the file's LoadBalancer Services keep
/// ([`crate::ipam::assign_standalone`]).
///
/// # Errors
/// As [`load_file`].
pub fn reload_file_for_node(
    path: &Path,
    fallback_node_name: Option<&str>,
    previous: &ClusterState,
) -> Result<Loaded, LoadError> {
    let text = std::fs::read_to_string(path).map_err(|source| LoadError::Read { path: path.to_owned(), source })?;
    load_str_after(&text, &path.display().to_string(), fallback_node_name, Some(previous))
}

/// [`load_str_for_node`], keeping the pool addresses of `previous` (see
/// [`reload_file_for_node`]).
///
/// # Errors
/// As [`load_str`].
pub fn load_str_after(
    text: &str,
    source_name: &str,
    fallback_node_name: Option<&str>,
    previous: Option<&ClusterState>,
) -> Result<Loaded, LoadError> {
    let mut c = Collector::default();
    // YAML 1.2 booleans only: `name: y` or `zone: no` stay strings, as in Kubernetes.
    let options = serde_saphyr::options! { with_snippet: false, strict_booleans: true };
    for (i, doc) in split_documents(text).into_iter().enumerate() {
        let here = Here { document: i + 1, line: doc.content_line, item: None };
        match serde_saphyr::from_str_with_options::<serde_json::Value>(doc.text, options.clone()) {
            Ok(serde_json::Value::Null) => {}
            Ok(v) => c.object(v, here),
            Err(e) => {
                let line = e
                    .location()
                    .and_then(|l| usize::try_from(l.line()).ok())
                    .filter(|&l| l > 0)
                    .map_or(doc.content_line, |l| doc.first_line + l - 1);
                let column = e.location().map(|l| l.column());
                let mut msg = yaml_message(&e);
                if let Some(c) = column.filter(|&c| c > 0) {
                    msg.push_str(&format!(" (column {c})"));
                }
                c.errors.push(DocError {
                    document: i + 1,
                    line,
                    item: None,
                    object: None,
                    field: None,
                    message: format!("YAML syntax: {msg}"),
                });
            }
        }
    }
    let mut notes = c.settle();
    if c.config.is_none() && c.errors.is_empty() {
        c.errors.push(DocError {
            document: 0,
            line: 1,
            item: None,
            object: None,
            field: None,
            message: format!(
                "no {KIND} document (apiVersion: {API_VERSION}, kind: {KIND}) and no {} (apiVersion: {})",
                crate::kubeproxy::KIND,
                crate::kubeproxy::API_VERSION
            ),
        });
    }
    if !c.errors.is_empty() {
        return Err(LoadError::Invalid { source_name: source_name.to_owned(), errors: c.errors });
    }
    let Some((mut config, _)) = c.config else { unreachable!("missing config was turned into an error above") };
    if config.node_name().is_none()
        && let Some(name) = fallback_node_name.map(str::trim).filter(|n| !n.is_empty())
    {
        notes.push(format!("nodeName {name:?} taken from ${NODE_NAME_ENV}"));
        config.node_name = Some(name.to_owned());
    }
    let node = match config.node_name() {
        Some(name) => {
            let found = c.nodes.iter().find(|n| n.metadata.name.as_deref() == Some(name)).cloned();
            if found.is_none() && !c.nodes.is_empty() {
                notes.push(format!(
                    "no Node object is named {name:?}; node addresses and zone come from the config only"
                ));
            }
            found
        }
        None => match c.nodes.as_slice() {
            [one] => Some(one.clone()),
            [] => None,
            _ => {
                notes.push(format!("{} Node objects but no nodeName in the {KIND}; none is used", c.nodes.len()));
                None
            }
        },
    };
    let ignored = c.nodes.len() - usize::from(node.is_some());
    if ignored > 0 && node.is_some() {
        notes.push(format!("{ignored} Node object(s) other than this node's are ignored"));
    }
    let mut cluster = ClusterState {
        services: c.services.into_iter().map(Arc::new).collect(),
        endpoint_slices: c.slices.into_iter().map(Arc::new).collect(),
        node,
        local_addresses: Vec::new(),
    };
    notes.extend(crate::ipam::assign_standalone(&config, &mut cluster, previous));
    Ok(Loaded { config, cluster, notes })
}

/// The YAML error message without its location suffix: the line it gives counts from the
/// start of the document, so the caller reports the absolute line instead.
fn yaml_message(e: &serde_saphyr::Error) -> String {
    let s = e.to_string();
    let first = s.lines().next().unwrap_or_default();
    match first.rfind(" at line ") {
        Some(i) if first[i..].contains(", column ") => first[..i].to_owned(),
        _ => first.to_owned(),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::net::IpAddr;
    use std::time::Duration;

    use dataplane::addr::Cidr;
    use dataplane::tables::ForwardingMode;

    use super::*;

    /// The header of an `XlbConfiguration` document (the config module's tests use these too).
    pub(crate) const HEAD: &str = "apiVersion: xlb.dev/v1alpha1\nkind: XlbConfiguration\n";

    /// Loads `text` as the file `test.yaml`.
    pub(crate) fn load(text: &str) -> Result<Loaded, LoadError> {
        load_str(text, "test.yaml")
    }

    /// The errors of loading `text`; panics if it loads or fails otherwise.
    pub(crate) fn errors(text: &str) -> Vec<DocError> {
        match load(text) {
            Err(LoadError::Invalid { errors, .. }) => errors,
            Err(e) => panic!("unexpected error {e}"),
            Ok(_) => panic!("expected an error"),
        }
    }

    /// `config.conf` of the kube-proxy ConfigMap as kubeadm writes it.
    fn kubeadm_config_conf() -> String {
        let cm: serde_json::Value =
            serde_saphyr::from_str(include_str!("../tests/data/kube-proxy-configmap-kubeadm.yaml")).unwrap();
        cm["data"]["config.conf"].as_str().unwrap().to_owned()
    }

    #[test]
    fn kubeadms_kube_proxy_configmap_is_a_valid_config_verbatim() {
        let l = load(&kubeadm_config_conf()).unwrap();
        let c = &l.config;
        assert_eq!(c.cluster_cidr, vec!["10.244.0.0/16".parse::<Cidr>().unwrap()]);
        // Every other field holds kube-proxy's zero value, "unset": xlb's defaults, which are
        // kube-proxy's where the field exists.
        let d = Config { cluster_cidr: c.cluster_cidr.clone(), ..Config::default() };
        assert_eq!(*c, d);
        assert_eq!(c.metrics_bind_address.to_string(), "127.0.0.1:10249");
        // One note per field set that xlb does not use.
        let notes = l.notes.join("\n");
        assert!(notes.contains("KubeProxyConfiguration bindAddress: accepted, not used"), "{notes}");
        assert!(notes.contains("KubeProxyConfiguration clientConnection.kubeconfig: accepted, not used"), "{notes}");
        assert_eq!(l.notes.len(), 2, "{notes}");
    }

    #[test]
    fn an_xlb_configuration_beside_a_kube_proxy_configuration_adds_xlbs_own_settings() {
        let text = format!(
            "{}\n---\n{HEAD}nodeName: node-a\ninterfaces: [{{name: eth0, queues: [0]}}]\ncores: [0]\n\
             conntrack: {{maxPerCore: 4096}}\nforwardingMode: dsr-l2\n",
            kubeadm_config_conf()
                .replace("maxPerCore: null", "maxPerCore: 65536")
                .replace("tcpEstablishedTimeout: null", "tcpEstablishedTimeout: 1h")
        );
        // conntrack.maxPerCore is in both: an error naming the field and both documents.
        let e = errors(&text);
        assert_eq!(e.len(), 1, "{e:?}");
        assert_eq!(e[0].field.as_deref(), Some("conntrack.maxPerCore"));
        assert!(e[0].message.contains("also set by the KubeProxyConfiguration (document 1)"), "{}", e[0].message);
        let l = load(&text.replace("conntrack: {maxPerCore: 4096}\n", "")).unwrap();
        let c = &l.config;
        assert_eq!(c.conntrack.max_per_core, 65536);
        assert_eq!(c.conntrack.tcp_established_timeout, Duration::from_secs(3600));
        assert_eq!(c.node_name.as_deref(), Some("node-a"));
        assert_eq!(c.forwarding_mode, ForwardingMode::DsrL2);
        assert_eq!(c.interfaces.len(), 1);
    }

    #[test]
    fn a_kube_proxy_configuration_with_an_unknown_field_names_it() {
        let e = errors(&kubeadm_config_conf().replace("mode: \"\"", "mode: \"\"\nproxyMode: ipvs"));
        assert_eq!(e[0].field.as_deref(), Some("proxyMode"), "{e:?}");
        assert_eq!(e[0].object.as_deref(), Some("KubeProxyConfiguration"));
    }

    #[test]
    fn node_name_env_names_the_node_only_when_the_file_does_not() {
        let nodes = "---\napiVersion: v1\nkind: Node\nmetadata: {name: n1}\n---\napiVersion: v1\nkind: Node\nmetadata: {name: n2}\n";
        // Unnamed file: the fallback names the node, and picks that Node object.
        let l = load_str_for_node(&format!("{HEAD}{nodes}"), "t", Some(" n2 ")).unwrap();
        assert_eq!(l.config.node_name(), Some("n2"));
        assert_eq!(l.cluster.node.and_then(|n| n.metadata.name).as_deref(), Some("n2"));
        assert!(l.notes.iter().any(|n| n.contains("NODE_NAME")), "{:?}", l.notes);
        // The file wins over the environment (nodeName and hostnameOverride alike).
        for key in ["nodeName", "hostnameOverride"] {
            let l = load_str_for_node(&format!("{HEAD}{key}: n1\n{nodes}"), "t", Some("n2")).unwrap();
            assert_eq!(l.config.node_name(), Some("n1"), "{key}");
            assert!(l.config.hostname_override.is_none() || l.config.node_name.is_none(), "{key}: nothing added");
        }
        // Blank or missing: no node.
        for v in [None, Some(""), Some("  ")] {
            let l = load_str_for_node(HEAD, "t", v).unwrap();
            assert_eq!(l.config.node_name(), None, "{v:?}");
        }
    }

    #[test]
    fn kubernetes_objects_list_and_documents_are_loaded() {
        let text = format!(
            "---\n{HEAD}nodeName: n1\n---\n# a comment-only document is skipped\n---\napiVersion: v1\nkind: List\nitems:\n\
- apiVersion: v1\n  kind: Service\n  metadata: {{name: web}}\n  spec: {{clusterIP: 10.96.0.1, ports: [{{port: 80}}]}}\n\
- apiVersion: discovery.k8s.io/v1\n  kind: EndpointSlice\n  metadata: {{name: web-1, namespace: default, labels: {{kubernetes.io/service-name: web}}}}\n  addressType: IPv4\n  endpoints: []\n\
---\napiVersion: v1\nkind: Node\nmetadata: {{name: n1}}\n---\napiVersion: v1\nkind: Node\nmetadata: {{name: n2}}\n"
        );
        let l = load(&text).unwrap();
        assert_eq!(l.cluster.services.len(), 1);
        assert_eq!(l.cluster.services[0].metadata.namespace.as_deref(), Some("default"));
        assert_eq!(l.cluster.endpoint_slices.len(), 1);
        assert_eq!(l.cluster.node.as_ref().unwrap().metadata.name.as_deref(), Some("n1"));
        assert_eq!(l.notes.len(), 1, "{:?}", l.notes);
    }

    #[test]
    fn object_errors_name_document_line_object_and_field() {
        let text = format!(
            "{HEAD}---\napiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  namespace: shop\nspec:\n  ports:\n  - port: http\n"
        );
        let e = errors(&text);
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].document, 2);
        assert_eq!(e[0].line, 4);
        assert_eq!(e[0].object.as_deref(), Some("Service shop/web"));
        assert_eq!(e[0].field.as_deref(), Some("spec.ports[0].port"));
        let s = e[0].to_string();
        assert!(s.starts_with("document 2 (line 4), Service shop/web, field spec.ports[0].port: "), "{s}");
    }

    #[test]
    fn yaml_syntax_errors_carry_the_absolute_line() {
        let text = format!("{HEAD}---\napiVersion: v1\nkind: Service\nmetadata: {{name: [\n");
        let e = errors(&text);
        assert_eq!(e[0].document, 2);
        assert!(e[0].message.starts_with("YAML syntax"), "{}", e[0]);
        assert!(!e[0].message.contains("at line"), "relative line numbers are stripped: {}", e[0]);
        assert!(e[0].line >= 6, "the line counts from the start of the file: {}", e[0]);
    }

    #[test]
    fn wrong_kind_api_version_duplicates_and_missing_config_are_errors() {
        let e = errors(&format!("{HEAD}---\napiVersion: v1\nkind: Pod\nmetadata: {{name: p}}\n"));
        assert_eq!(e[0].field.as_deref(), Some("kind"));
        let e = errors(&format!("{HEAD}---\napiVersion: discovery.k8s.io/v1beta1\nkind: EndpointSlice\n"));
        assert_eq!(e[0].field.as_deref(), Some("apiVersion"));
        let svc = "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {clusterIP: 10.96.0.1}\n";
        let e = errors(&format!("{HEAD}---\n{svc}---\n{svc}"));
        assert_eq!(e[0].document, 3);
        assert!(e[0].message.contains("document 2"), "{}", e[0]);
        let e = errors(svc);
        assert!(e[0].message.contains("no XlbConfiguration"), "{}", e[0]);
        let e = errors(&format!("{HEAD}---\n{HEAD}"));
        assert!(e[0].message.contains("second"), "{}", e[0]);
    }

    #[test]
    fn yaml_1_1_booleans_stay_strings_and_address_type_is_checked() {
        let text = format!(
            "{HEAD}---\napiVersion: v1\nkind: Node\nmetadata: {{name: y, labels: {{topology.kubernetes.io/zone: no}}}}\n"
        );
        let l = load(&text).unwrap();
        let n = l.cluster.node.unwrap();
        assert_eq!(n.metadata.name.as_deref(), Some("y"));
        let e = errors(&format!(
            "{HEAD}---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: x}}\nendpoints: []\n"
        ));
        assert_eq!(e[0].field.as_deref(), Some("addressType"), "{}", e[0]);
        assert_eq!(e[0].object.as_deref(), Some("EndpointSlice default/x"));
    }

    const POOLS: &str = "addressPools:\n\
- name: public\n  addresses: [198.51.100.0/30, \"2001:db8:100::-2001:db8:100::3\"]\n\
- name: shop\n  addresses: [203.0.113.8-203.0.113.9]\n  autoAssign: false\n  avoidBuggyIPs: true\n\x20 \
serviceAllocation: {priority: 1, namespaces: [shop], serviceSelectors: [{matchLabels: {tier: web}, matchExpressions: [{key: env, operator: NotIn, values: [dev]}]}]}\n";

    fn lb_service(name: &str, extra_spec: &str, status: &str) -> String {
        format!(
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: shop, labels: {{tier: web}}}}\n\
spec: {{type: LoadBalancer, clusterIP: 10.96.0.{n}, clusterIPs: [10.96.0.{n}], ports: [{{port: 80}}]{extra_spec}}}\n{status}",
            n = name.bytes().map(u32::from).sum::<u32>() % 250
        )
    }

    #[test]
    fn standalone_load_balancer_services_get_addresses_from_the_pools_and_become_vips() {
        let text = format!(
            "{HEAD}{POOLS}{}{}{}{}{}",
            lb_service("auto", "", ""),
            lb_service("static", ", loadBalancerIP: 192.0.2.77", ""),
            lb_service("written", "", "status: {loadBalancer: {ingress: [{ip: 198.51.100.3}]}}\n"),
            lb_service("pinned", "", "")
                .replace("labels: {tier: web}", "labels: {tier: web}, annotations: {xlb.dev/address-pool: shop}"),
            lb_service("other", ", loadBalancerClass: example.com/lb", ""),
        );
        let l = load(&text).unwrap();
        let (spec, report) = crate::translate::build_spec(&l.cluster, &l.config).unwrap();
        assert!(!report.has_errors(), "{:?}", report.issues);
        let lb_vips: Vec<String> = spec
            .services
            .iter()
            .flat_map(|s| {
                s.frontends
                    .iter()
                    .filter(|f| f.kind == dataplane::tables::FrontendKind::LoadBalancer)
                    .map(move |f| format!("{} {}", s.name, f.addr))
            })
            .collect();
        assert_eq!(
            lb_vips,
            [
                "shop/auto:80 198.51.100.0",
                "shop/pinned:80 203.0.113.8",
                "shop/static:80 192.0.2.77",
                "shop/written:80 198.51.100.3",
            ],
            "notes: {:?}",
            l.notes
        );
        assert!(
            l.notes.iter().any(|n| n == "Service shop/auto: LoadBalancer address 198.51.100.0 from pool \"public\""),
            "{:?}",
            l.notes
        );
        assert!(l.notes.iter().any(|n| n.contains("shop/static") && n.contains("outside the pools")), "{:?}", l.notes);
        assert!(!l.notes.iter().any(|n| n.contains("shop/written") || n.contains("shop/other")), "{:?}", l.notes);
    }

    #[test]
    fn a_reload_keeps_the_pool_addresses_the_running_file_gave() {
        let pools = "addressPools: [{name: p, addresses: [198.51.100.0/30]}]\n";
        let first = load(&format!("{HEAD}{pools}{}", lb_service("web", "", ""))).unwrap();
        assert_eq!(crate::ipam::ingress_ips(&first.cluster.services[0]), ["198.51.100.0".parse::<IpAddr>().unwrap()]);
        // A Service added before it in the order would take 198.51.100.0 on a fresh load ...
        let text = format!("{HEAD}{pools}{}{}", lb_service("api", "", ""), lb_service("web", "", ""));
        let fresh = load(&text).unwrap();
        let ips = |l: &Loaded| -> Vec<String> {
            l.cluster
                .services
                .iter()
                .map(|s| format!("{}={:?}", s.metadata.name.as_deref().unwrap(), crate::ipam::ingress_ips(s)))
                .collect()
        };
        assert_eq!(ips(&fresh), ["api=[198.51.100.0]", "web=[198.51.100.1]"]);
        // ... but a reload keeps web's address and gives api the next one.
        let reloaded = load_str_after(&text, "test.yaml", None, Some(&first.cluster)).unwrap();
        assert_eq!(ips(&reloaded), ["api=[198.51.100.1]", "web=[198.51.100.0]"]);
        assert!(!reloaded.notes.iter().any(|n| n.contains("shop/web")), "kept silently: {:?}", reloaded.notes);
        // An address outside the pools (a static one the file no longer gives) is not carried.
        let stat = load(&format!("{HEAD}{pools}{}", lb_service("web", ", loadBalancerIP: 192.0.2.1", ""))).unwrap();
        let again =
            load_str_after(&format!("{HEAD}{pools}{}", lb_service("web", "", "")), "t", None, Some(&stat.cluster))
                .unwrap();
        assert_eq!(ips(&again), ["web=[198.51.100.0]"]);
    }

    #[test]
    fn standalone_services_that_cannot_get_an_address_are_noted_and_get_no_vip() {
        let text = format!(
            "{HEAD}addressPools: [{{name: one, addresses: [198.51.100.1/32]}}]\n{}{}{}",
            lb_service("first", "", ""),
            lb_service("second", "", ""),
            lb_service(
                "clash",
                ", loadBalancerIP: 198.51.100.1",
                "status: {loadBalancer: {ingress: [{ip: 198.51.100.9}]}}\n"
            ),
        );
        let l = load(&text).unwrap();
        let (spec, _) = crate::translate::build_spec(&l.cluster, &l.config).unwrap();
        let lb: Vec<String> = spec
            .services
            .iter()
            .flat_map(|s| {
                s.frontends
                    .iter()
                    .filter(|f| f.kind == dataplane::tables::FrontendKind::LoadBalancer)
                    .map(move |f| format!("{} {}", s.name, f.addr))
            })
            .collect();
        assert_eq!(lb, ["shop/clash:80 198.51.100.1"], "the request is served first; {:?}", l.notes);
        assert!(
            l.notes
                .iter()
                .any(|n| n == "Service shop/first: no LoadBalancer address: no free address in address pool(s) one"),
            "{:?}",
            l.notes
        );
        // Without pools, a Service that asks for nothing stays without an address, silently.
        let l = load(&format!("{HEAD}{}", lb_service("plain", "", ""))).unwrap();
        assert!(l.notes.is_empty(), "{:?}", l.notes);
        assert!(crate::ipam::ingress_ips(&l.cluster.services[0]).is_empty());
    }

    #[test]
    fn split_documents_counts_only_non_empty_documents() {
        let d = split_documents("# c\n---\na: 1\n...\n---\n\n---\nb: 2\n");
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].content_line, 3);
        assert_eq!(d[1].content_line, 8);
        assert_eq!(split_documents("--- {a: 1}\n").len(), 1);
    }
}
