//! An in-process fake Kubernetes API server over HTTP (axum on 127.0.0.1:0), enough for
//! kube-rs watchers: list (with `limit`/`continue` paging), streamed watch of
//! newline-delimited JSON events (ADDED/MODIFIED/DELETED/BOOKMARK/ERROR) from a
//! `resourceVersion`, `allowWatchBookmarks`, `timeoutSeconds` closes, `fieldSelector`
//! `metadata.name=` (and `metadata.namespace=`), `labelSelector` with equality terms
//! (`key=value`, `key==value`, `key!=value`) and existence terms (`key`, `!key`), an in-stream `ERROR` 410 Expired inside a 200 response when the asked
//! resourceVersion is older than the compaction point, dropped connections (the body ends
//! with an error, so the client sees a broken stream), failing requests (500), and lists
//! that are held back until released.
//!
//! Also: cluster-scoped `XlbIPPool` objects (list/watch), `coordination.k8s.io/v1` Leases
//! (get, create, update with the `resourceVersion` precondition: 409 Conflict when stale,
//! 409 AlreadyExists on a second create; delete; list and watch in their namespace), and JSON merge patches of the `services/status`
//! subresource (only `status` is taken from the patch; a `metadata.resourceVersion` in the
//! patch is a precondition, 409 Conflict when stale), each recorded with its `fieldManager`.
//!
//! One global resourceVersion counter across kinds, like etcd.
//!
//! [`FakeApiServer::start_tls`] serves the same over HTTPS (rustls, HTTP/1.1) and answers
//! 401 Unauthorized to every request without the expected bearer token, as the real API
//! server does for a client without credentials; it counts the handshakes that failed.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::Path;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, patch};
use futures::SinkExt;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{broadcast, watch};
use tokio_rustls::server::TlsStream;

/// The served kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Res {
    Services,
    EndpointSlices,
    Nodes,
    Pools,
    Leases,
}

impl Res {
    fn api_version(self) -> &'static str {
        match self {
            Self::Services | Self::Nodes => "v1",
            Self::EndpointSlices => "discovery.k8s.io/v1",
            Self::Pools => "xlb.dev/v1alpha1",
            Self::Leases => "coordination.k8s.io/v1",
        }
    }
    fn kind(self) -> &'static str {
        match self {
            Self::Services => "Service",
            Self::EndpointSlices => "EndpointSlice",
            Self::Nodes => "Node",
            Self::Pools => "XlbIPPool",
            Self::Leases => "Lease",
        }
    }
}

#[derive(Debug, Clone)]
struct Ev {
    rv: u64,
    res: Res,
    ty: &'static str,
    obj: Value,
}

#[derive(Debug, Default)]
struct State0 {
    rv: u64,
    compacted: u64,
    objects: BTreeMap<(Res, String, String), Value>,
    history: Vec<Ev>,
    failing: bool,
    lists: HashMap<Res, usize>,
    watches: HashMap<Res, usize>,
    /// Accepted `services/status` patches: (`namespace/name`, fieldManager, patch body).
    status_patches: Vec<(String, String, Value)>,
    /// Lease writes (create and update) accepted.
    lease_writes: usize,
    /// Lease deletions accepted.
    lease_deletes: usize,
    /// Test hook: when a `services/status` patch for `namespace/name` arrives, this object
    /// is stored first (a change that lands on the server just before the patch), and the
    /// watch events from the patch's resourceVersion on are held back until
    /// [`FakeApiServer::release_watch_events`] (delivered in order, only late).
    before_status_patch: Option<(String, Res, Value)>,
    /// Watch events with a resourceVersion at or above this wait (test hook above).
    hold_events_from: Option<u64>,
}

#[derive(Debug)]
struct Inner {
    state: Mutex<State0>,
    events: broadcast::Sender<Ev>,
    /// Bumped to drop every open watch connection.
    kill: watch::Sender<u64>,
    /// Lists of these kinds wait until released.
    held: watch::Sender<HashSet<Res>>,
    bookmark_every: Duration,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State0> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A running fake API server; stops when dropped.
#[derive(Debug)]
pub(crate) struct FakeApiServer {
    addr: SocketAddr,
    inner: Arc<Inner>,
    task: tokio::task::JoinHandle<()>,
    /// `https` when started with [`FakeApiServer::start_tls`], else `http`.
    scheme: &'static str,
    /// TLS handshakes that failed (the client refused the certificate, or spoke no TLS).
    failed_handshakes: Arc<AtomicUsize>,
}

/// What [`FakeApiServer::start_tls`] serves with: the server's certificate chain and private
/// key, and the bearer token every request must carry (`Authorization: Bearer <token>`).
pub(crate) struct TlsIdentity {
    pub(crate) chain: Vec<CertificateDer<'static>>,
    pub(crate) key: PrivateKeyDer<'static>,
    pub(crate) token: String,
}

/// TLS connections for `axum::serve`: a task accepts TCP connections and runs each handshake
/// on a task of its own (a client that refuses the certificate holds up no other), handing
/// the established streams over a channel.
struct TlsListener {
    streams: tokio::sync::mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    addr: SocketAddr,
    accept_task: tokio::task::JoinHandle<()>,
}

impl TlsListener {
    fn new(tcp: TcpListener, config: Arc<rustls::ServerConfig>, failed: Arc<AtomicUsize>) -> Self {
        let addr = tcp.local_addr().expect("local addr");
        let (tx, streams) = tokio::sync::mpsc::channel(64);
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        let accept_task = tokio::spawn(async move {
            while let Ok((tcp, peer)) = tcp.accept().await {
                let (acceptor, tx, failed) = (acceptor.clone(), tx.clone(), failed.clone());
                tokio::spawn(async move {
                    match acceptor.accept(tcp).await {
                        Ok(tls) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Err(_) => {
                            failed.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                });
            }
        });
        Self { streams, addr, accept_task }
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.accept_task.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.streams.recv().await {
            Some(s) => s,
            // The accept task ended (it never does while the listener lives): serve nothing more.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.addr)
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn key_of(res: Res, obj: &Value) -> (Res, String, String) {
    let ns = obj["metadata"]["namespace"].as_str().unwrap_or("").to_owned();
    let name = obj["metadata"]["name"].as_str().unwrap_or("").to_owned();
    (res, ns, name)
}

/// Whether `obj` matches the query's `fieldSelector` and `labelSelector`.
fn matches(q: &Selectors, obj: &Value) -> bool {
    let fields = q.fields.as_deref().filter(|s| !s.is_empty()).is_none_or(|sel| {
        sel.split(',').all(|term| match term.split_once('=') {
            Some(("metadata.name", v)) => obj["metadata"]["name"].as_str() == Some(v),
            Some(("metadata.namespace", v)) => obj["metadata"]["namespace"].as_str() == Some(v),
            _ => true,
        })
    });
    let labels = q.labels.as_deref().filter(|s| !s.is_empty()).is_none_or(|sel| {
        let label = |k: &str| obj["metadata"]["labels"][k].as_str().map(str::to_owned);
        sel.split(',').map(str::trim).all(|term| {
            if let Some((k, v)) = term.split_once("!=") {
                label(k.trim()).as_deref() != Some(v.trim())
            } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                label(k.trim()).as_deref() == Some(v.trim())
            } else if let Some(k) = term.strip_prefix('!') {
                label(k.trim()).is_none()
            } else {
                label(term).is_some()
            }
        })
    });
    fields && labels
}

/// A request's `fieldSelector` and `labelSelector`.
#[derive(Debug, Clone, Default)]
struct Selectors {
    fields: Option<String>,
    labels: Option<String>,
}

impl Selectors {
    fn of(q: &HashMap<String, String>) -> Self {
        Self { fields: q.get("fieldSelector").cloned(), labels: q.get("labelSelector").cloned() }
    }
}

fn line(v: &Value) -> Bytes {
    let mut s = v.to_string();
    s.push('\n');
    Bytes::from(s)
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

impl FakeApiServer {
    /// Starts on 127.0.0.1:0; bookmarks every 500 ms on watches that allow them.
    pub(crate) async fn start() -> Self {
        Self::start_at("127.0.0.1:0".parse().expect("address"), 1).await
    }

    /// Starts on `addr` (`SO_REUSEADDR`, so a restarted server can take its predecessor's
    /// port) with its resourceVersion counter at `first_rv`. With `first_rv > 1` the history
    /// before it counts as compacted: a watch from an older resourceVersion (a client of a
    /// previous server) gets an in-stream ERROR 410 Expired, as after an etcd restore.
    pub(crate) async fn start_at(addr: SocketAddr, first_rv: u64) -> Self {
        Self::start_with(addr, first_rv, None).await
    }

    /// [`FakeApiServer::start`] over HTTPS with `identity`'s certificate and key; every
    /// request without `Authorization: Bearer <identity.token>` is answered 401 Unauthorized.
    pub(crate) async fn start_tls(identity: TlsIdentity) -> Self {
        Self::start_with("127.0.0.1:0".parse().expect("address"), 1, Some(identity)).await
    }

    async fn start_with(addr: SocketAddr, first_rv: u64, tls: Option<TlsIdentity>) -> Self {
        let (events, _) = broadcast::channel(4096);
        let compacted = if first_rv > 1 { first_rv } else { 0 };
        let inner = Arc::new(Inner {
            state: Mutex::new(State0 { rv: first_rv, compacted, ..Default::default() }),
            events,
            kill: watch::channel(0).0,
            held: watch::channel(HashSet::new()).0,
            bookmark_every: Duration::from_millis(500),
        });
        let app = Router::new()
            .route("/api/v1/services", get(|s, q| handle(s, q, Res::Services)))
            .route("/apis/discovery.k8s.io/v1/endpointslices", get(|s, q| handle(s, q, Res::EndpointSlices)))
            .route("/api/v1/nodes", get(|s, q| handle(s, q, Res::Nodes)))
            .route("/apis/xlb.dev/v1alpha1/xlbippools", get(|s, q| handle(s, q, Res::Pools)))
            .route(
                "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases",
                get(|s, Path(ns): Path<String>, Query(mut q): Query<HashMap<String, String>>| {
                    // A namespaced list or watch: the namespace as one more field selector term.
                    let term = format!("metadata.namespace={ns}");
                    let sel = q
                        .get("fieldSelector")
                        .filter(|f| !f.is_empty())
                        .map_or(term.clone(), |f| format!("{f},{term}"));
                    q.insert("fieldSelector".into(), sel);
                    handle(s, Query(q), Res::Leases)
                })
                .post(lease_create),
            )
            .route(
                "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{name}",
                get(lease_get).put(lease_update).delete(lease_delete),
            )
            .route("/api/v1/namespaces/{ns}/services/{name}/status", patch(service_status_patch))
            .fallback(|| async { (StatusCode::NOT_FOUND, status(404, "NotFound", "not served").to_string()) })
            .with_state(inner.clone());
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.set_reuseaddr(true).expect("SO_REUSEADDR");
        socket.bind(addr).expect("bind fake apiserver");
        let listener = socket.listen(1024).expect("listen");
        let addr = listener.local_addr().expect("local addr");
        let failed_handshakes = Arc::new(AtomicUsize::new(0));
        let (task, scheme) = match tls {
            None => (
                tokio::spawn(async move {
                    let _ = axum::serve(listener, app).await;
                }),
                "http",
            ),
            Some(TlsIdentity { chain, key, token }) => {
                let provider = Arc::new(rustls::crypto::ring::default_provider());
                let config = rustls::ServerConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .expect("TLS versions")
                    .with_no_client_auth()
                    .with_single_cert(chain, key)
                    .expect("server certificate");
                let expected = format!("Bearer {token}");
                let app = app.layer(axum::middleware::from_fn(move |req: axum::extract::Request, next: Next| {
                    let authorized = req.headers().get(header::AUTHORIZATION).is_some_and(|v| *v == *expected);
                    async move {
                        if authorized {
                            next.run(req).await
                        } else {
                            (StatusCode::UNAUTHORIZED, status(401, "Unauthorized", "Unauthorized").to_string())
                                .into_response()
                        }
                    }
                }));
                let listener = TlsListener::new(listener, Arc::new(config), failed_handshakes.clone());
                (
                    tokio::spawn(async move {
                        let _ = axum::serve(listener, app).await;
                    }),
                    "https",
                )
            }
        };
        Self { addr, inner, task, scheme, failed_handshakes }
    }

    /// TLS handshakes that failed since the start ([`FakeApiServer::start_tls`]; always 0
    /// over HTTP).
    pub(crate) fn failed_handshakes(&self) -> usize {
        self.failed_handshakes.load(Ordering::SeqCst)
    }

    /// The address it listens on.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The current resourceVersion (the last change's).
    pub(crate) fn resource_version(&self) -> u64 {
        self.inner.lock().rv
    }

    /// `http://127.0.0.1:PORT` (`https://` when started with [`FakeApiServer::start_tls`]).
    pub(crate) fn url(&self) -> String {
        format!("{}://{}", self.scheme, self.addr)
    }

    /// A kube client for it.
    pub(crate) fn client(&self) -> kube::Client {
        let cfg = kube::Config::new(self.url().parse().expect("url"));
        kube::Client::try_from(cfg).expect("client")
    }

    /// Creates or replaces an object (ADDED or MODIFIED); returns its resourceVersion.
    pub(crate) fn apply(&self, res: Res, obj: Value) -> u64 {
        let mut st = self.inner.lock();
        store(&self.inner, &mut st, res, obj);
        st.rv
    }

    /// Deletes an object (DELETED, seen by watchers, also after a reconnect from an older
    /// resourceVersion).
    pub(crate) fn delete(&self, res: Res, ns: &str, name: &str) {
        let mut st = self.inner.lock();
        let Some(mut obj) = st.objects.remove(&(res, ns.to_owned(), name.to_owned())) else { return };
        st.rv += 1;
        let rv = st.rv;
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        let ev = Ev { rv, res, ty: "DELETED", obj };
        st.history.push(ev.clone());
        let _ = self.inner.events.send(ev);
    }

    /// Drops every open watch connection (the body ends with an error).
    pub(crate) fn drop_connections(&self) {
        self.inner.kill.send_modify(|g| *g += 1);
    }

    /// Forgets the history up to now: a watch from an older resourceVersion gets an
    /// in-stream ERROR 410 Expired.
    pub(crate) fn compact(&self) {
        let mut st = self.inner.lock();
        st.compacted = st.rv;
        st.history.clear();
    }

    /// A gap: atomically drops every watch connection, deletes `name` without any event
    /// (so only a relist can notice), and compacts. Reconnecting watchers get 410.
    pub(crate) fn delete_during_gap_and_compact(&self, res: Res, ns: &str, name: &str) {
        let mut st = self.inner.lock();
        self.inner.kill.send_modify(|g| *g += 1);
        st.objects.remove(&(res, ns.to_owned(), name.to_owned()));
        st.rv += 1;
        st.compacted = st.rv;
        st.history.clear();
    }

    /// Makes every request fail with 500 (while `true`).
    pub(crate) fn set_failing(&self, failing: bool) {
        self.inner.lock().failing = failing;
    }

    /// Holds (or releases) list requests of `res`.
    pub(crate) fn hold_lists(&self, res: Res, hold: bool) {
        self.inner.held.send_modify(|h| {
            if hold {
                h.insert(res);
            } else {
                h.remove(&res);
            }
        });
    }

    /// List requests served for `res` (pages count one each).
    pub(crate) fn list_count(&self, res: Res) -> usize {
        self.inner.lock().lists.get(&res).copied().unwrap_or(0)
    }

    /// The stored object, if any.
    pub(crate) fn get(&self, res: Res, ns: &str, name: &str) -> Option<Value> {
        self.inner.lock().objects.get(&(res, ns.to_owned(), name.to_owned())).cloned()
    }

    /// The `services/status` patches accepted so far: (`namespace/name`, fieldManager, body).
    pub(crate) fn status_patches(&self) -> Vec<(String, String, Value)> {
        self.inner.lock().status_patches.clone()
    }

    /// Lease creates and updates accepted so far.
    pub(crate) fn lease_writes(&self) -> usize {
        self.inner.lock().lease_writes
    }

    /// Lease deletions accepted so far.
    pub(crate) fn lease_deletes(&self) -> usize {
        self.inner.lock().lease_deletes
    }

    /// Test hook: stores `obj` just before the next `services/status` patch of `ns/name` is
    /// applied, and holds the watch events from that patch on until
    /// [`FakeApiServer::release_watch_events`].
    pub(crate) fn before_status_patch(&self, ns: &str, name: &str, res: Res, obj: Value) {
        self.inner.lock().before_status_patch = Some((format!("{ns}/{name}"), res, obj));
    }

    /// Delivers the watch events held back by [`FakeApiServer::before_status_patch`].
    pub(crate) fn release_watch_events(&self) {
        self.inner.lock().hold_events_from = None;
    }

    /// Watch requests started for `res`.
    pub(crate) fn watch_count(&self, res: Res) -> usize {
        self.inner.lock().watches.get(&res).copied().unwrap_or(0)
    }
}

async fn handle(State(inner): State<Arc<Inner>>, Query(q): Query<HashMap<String, String>>, res: Res) -> Response {
    if q.get("watch").is_some_and(|w| w == "true" || w == "1") {
        watch_response(inner, q, res)
    } else {
        list_response(inner, q, res).await
    }
}

fn json_ok(v: &Value) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], v.to_string()).into_response()
}

fn failure() -> Response {
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        [(header::CONTENT_TYPE, "application/json")],
        status(500, "InternalError", "injected failure").to_string(),
    )
        .into_response()
}

async fn list_response(inner: Arc<Inner>, q: HashMap<String, String>, res: Res) -> Response {
    let mut held = inner.held.subscribe();
    let _ = held.wait_for(|h| !h.contains(&res)).await;
    let mut st = inner.lock();
    if st.failing {
        return failure();
    }
    *st.lists.entry(res).or_default() += 1;
    let sel = Selectors::of(&q);
    let all: Vec<&Value> =
        st.objects.iter().filter(|((r, _, _), o)| *r == res && matches(&sel, o)).map(|(_, o)| o).collect();
    let offset: usize = q.get("continue").and_then(|c| c.parse().ok()).unwrap_or(0);
    let limit: usize = q.get("limit").and_then(|l| l.parse().ok()).filter(|l| *l > 0).unwrap_or(usize::MAX);
    let end = offset.saturating_add(limit).min(all.len());
    let items: Vec<&Value> = all.get(offset..end).unwrap_or_default().to_vec();
    let mut meta = json!({"resourceVersion": st.rv.to_string()});
    if end < all.len() {
        meta["continue"] = json!(end.to_string());
    }
    json_ok(&json!({
        "apiVersion": res.api_version(),
        "kind": format!("{}List", res.kind()),
        "metadata": meta,
        "items": items,
    }))
}

fn watch_response(inner: Arc<Inner>, q: HashMap<String, String>, res: Res) -> Response {
    let sel = Selectors::of(&q);
    let from: u64 = q.get("resourceVersion").and_then(|r| r.parse().ok()).unwrap_or(0);
    let timeout = q.get("timeoutSeconds").and_then(|t| t.parse::<u64>().ok()).map(Duration::from_secs);
    let bookmarks = q.get("allowWatchBookmarks").is_some_and(|b| b == "true");
    let (tx, rx) = futures::channel::mpsc::channel::<Result<Bytes, std::io::Error>>(64);
    let mut kill = inner.kill.subscribe();
    kill.mark_unchanged();
    let (backlog, mut events, expired) = {
        let mut st = inner.lock();
        if st.failing {
            return failure();
        }
        *st.watches.entry(res).or_default() += 1;
        let from = if from == 0 { st.rv } else { from };
        if from < st.compacted {
            let msg = format!("too old resource version: {from} ({})", st.compacted);
            (vec![], inner.events.subscribe(), Some(msg))
        } else {
            let backlog: Vec<Ev> = st.history.iter().filter(|e| e.rv > from && e.res == res).cloned().collect();
            // Subscribed under the lock: no event falls between backlog and live stream.
            (backlog, inner.events.subscribe(), None)
        }
    };
    let inner2 = inner.clone();
    tokio::spawn(async move {
        let mut tx = tx;
        if let Some(msg) = expired {
            let _ = tx.send(Ok(line(&json!({"type": "ERROR", "object": status(410, "Expired", &msg)})))).await;
            return;
        }
        let ok = |sel: &Selectors, e: &Ev| e.res == res && matches(sel, &e.obj);
        for e in backlog.iter().filter(|e| ok(&sel, e)) {
            if tx.send(Ok(line(&json!({"type": e.ty, "object": e.obj})))).await.is_err() {
                return;
            }
        }
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        let mut tick = tokio::time::interval(inner2.bookmark_every);
        tick.tick().await;
        loop {
            tokio::select! {
                biased;
                _ = kill.changed() => {
                    let _ = tx.send(Err(std::io::Error::other("connection dropped by the fake apiserver"))).await;
                    return;
                }
                () = async { match deadline { Some(d) => tokio::time::sleep_until(d).await, None => std::future::pending().await } } => return,
                ev = events.recv() => match ev {
                    Ok(e) => {
                        while inner2.lock().hold_events_from.is_some_and(|h| e.rv >= h) {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                        if ok(&sel, &e) && tx.send(Ok(line(&json!({"type": e.ty, "object": e.obj})))).await.is_err() {
                            return;
                        }
                    }
                    Err(_) => return,
                },
                _ = tick.tick(), if bookmarks => {
                    let rv = inner2.lock().rv;
                    let bm = json!({"type": "BOOKMARK", "object": {"kind": res.kind(), "apiVersion": res.api_version(),
                                    "metadata": {"resourceVersion": rv.to_string()}}});
                    if tx.send(Ok(line(&bm))).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
    ([(header::CONTENT_TYPE, "application/json")], Body::from_stream(rx)).into_response()
}

/// Stores `obj` under the next resourceVersion and tells the watchers (ADDED or MODIFIED).
fn store(inner: &Inner, st: &mut State0, res: Res, mut obj: Value) -> Value {
    st.rv += 1;
    let rv = st.rv;
    obj["apiVersion"] = json!(res.api_version());
    obj["kind"] = json!(res.kind());
    obj["metadata"]["resourceVersion"] = json!(rv.to_string());
    let key = key_of(res, &obj);
    let ty = if st.objects.insert(key, obj.clone()).is_some() { "MODIFIED" } else { "ADDED" };
    let ev = Ev { rv, res, ty, obj: obj.clone() };
    st.history.push(ev.clone());
    let _ = inner.events.send(ev);
    obj
}

fn answer(code: StatusCode, v: &Value) -> Response {
    (code, [(header::CONTENT_TYPE, "application/json")], v.to_string()).into_response()
}

fn not_found(what: &str) -> Response {
    answer(StatusCode::NOT_FOUND, &status(404, "NotFound", &format!("{what} not found")))
}

fn conflict(reason: &str, message: &str) -> Response {
    answer(StatusCode::CONFLICT, &status(409, reason, message))
}

async fn lease_get(State(inner): State<Arc<Inner>>, Path((ns, name)): Path<(String, String)>) -> Response {
    let st = inner.lock();
    if st.failing {
        return failure();
    }
    match st.objects.get(&(Res::Leases, ns, name.clone())) {
        Some(o) => json_ok(o),
        None => not_found(&format!("leases.coordination.k8s.io {name:?}")),
    }
}

async fn lease_create(State(inner): State<Arc<Inner>>, Path(ns): Path<String>, body: Bytes) -> Response {
    let Ok(mut obj) = serde_json::from_slice::<Value>(&body) else {
        return answer(StatusCode::BAD_REQUEST, &status(400, "BadRequest", "not JSON"));
    };
    let mut st = inner.lock();
    if st.failing {
        return failure();
    }
    obj["metadata"]["namespace"] = json!(ns);
    let key = key_of(Res::Leases, &obj);
    if st.objects.contains_key(&key) {
        return conflict("AlreadyExists", &format!("leases.coordination.k8s.io {:?} already exists", key.2));
    }
    st.lease_writes += 1;
    let stored = store(&inner, &mut st, Res::Leases, obj);
    answer(StatusCode::CREATED, &stored)
}

async fn lease_update(
    State(inner): State<Arc<Inner>>,
    Path((ns, name)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    let Ok(mut obj) = serde_json::from_slice::<Value>(&body) else {
        return answer(StatusCode::BAD_REQUEST, &status(400, "BadRequest", "not JSON"));
    };
    let mut st = inner.lock();
    if st.failing {
        return failure();
    }
    let key = (Res::Leases, ns.clone(), name.clone());
    let Some(current) = st.objects.get(&key) else { return not_found(&format!("leases.coordination.k8s.io {name:?}")) };
    if obj["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"] {
        return conflict("Conflict", "the object has been modified; please apply your changes to the latest version");
    }
    obj["metadata"]["namespace"] = json!(ns);
    obj["metadata"]["name"] = json!(name);
    st.lease_writes += 1;
    let stored = store(&inner, &mut st, Res::Leases, obj);
    json_ok(&stored)
}

async fn lease_delete(State(inner): State<Arc<Inner>>, Path((ns, name)): Path<(String, String)>) -> Response {
    let mut st = inner.lock();
    if st.failing {
        return failure();
    }
    let key = (Res::Leases, ns, name.clone());
    let Some(mut obj) = st.objects.remove(&key) else {
        return not_found(&format!("leases.coordination.k8s.io {name:?}"));
    };
    st.rv += 1;
    let rv = st.rv;
    obj["metadata"]["resourceVersion"] = json!(rv.to_string());
    st.lease_deletes += 1;
    let ev = Ev { rv, res: Res::Leases, ty: "DELETED", obj: obj.clone() };
    st.history.push(ev.clone());
    let _ = inner.events.send(ev);
    json_ok(&obj)
}

/// RFC 7386 JSON merge patch.
fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let t = target.as_object_mut().expect("an object");
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

async fn service_status_patch(
    State(inner): State<Arc<Inner>>,
    Path((ns, name)): Path<(String, String)>,
    Query(q): Query<HashMap<String, String>>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Response {
    let ct = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
    if ct != "application/merge-patch+json" {
        return answer(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            &status(415, "UnsupportedMediaType", &format!("this fake takes merge patches only, not {ct:?}")),
        );
    }
    let Ok(p) = serde_json::from_slice::<Value>(&body) else {
        return answer(StatusCode::BAD_REQUEST, &status(400, "BadRequest", "not JSON"));
    };
    let mut st = inner.lock();
    if st.failing {
        return failure();
    }
    if st.before_status_patch.as_ref().is_some_and(|(k, _, _)| *k == format!("{ns}/{name}")) {
        let (_, res, obj) = st.before_status_patch.take().expect("checked");
        store(&inner, &mut st, res, obj);
        st.hold_events_from = Some(st.rv + 1);
    }
    let key = (Res::Services, ns.clone(), name.clone());
    let Some(current) = st.objects.get(&key).cloned() else { return not_found(&format!("services {name:?}")) };
    if let Some(rv) = p["metadata"]["resourceVersion"].as_str()
        && Some(rv) != current["metadata"]["resourceVersion"].as_str()
    {
        return conflict("Conflict", "the object has been modified; please apply your changes to the latest version");
    }
    let mut obj = current;
    if let Some(s) = p.get("status") {
        merge_patch(&mut obj["status"], s);
    }
    let manager = q.get("fieldManager").cloned().unwrap_or_default();
    st.status_patches.push((format!("{ns}/{name}"), manager, p));
    let stored = store(&inner, &mut st, Res::Services, obj);
    json_ok(&stored)
}
