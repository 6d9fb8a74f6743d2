//! An in-process fake Kubernetes API server over HTTP (axum on 127.0.0.1:0), enough for
//! kube-rs watchers: list (with `limit`/`continue` paging), streamed watch of
//! newline-delimited JSON events (ADDED/MODIFIED/DELETED/BOOKMARK/ERROR) from a
//! `resourceVersion`, `allowWatchBookmarks`, `timeoutSeconds` closes, `fieldSelector`
//! `metadata.name=`, an in-stream `ERROR` 410 Expired inside a 200 response when the asked
//! resourceVersion is older than the compaction point, dropped connections (the body ends
//! with an error, so the client sees a broken stream), failing requests (500), and lists
//! that are held back until released.
//!
//! One global resourceVersion counter across kinds, like etcd.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures::SinkExt;
use serde_json::{Value, json};
use tokio::sync::{broadcast, watch};

/// The served kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Res {
    Services,
    EndpointSlices,
    Nodes,
}

impl Res {
    fn api_version(self) -> &'static str {
        match self {
            Self::Services | Self::Nodes => "v1",
            Self::EndpointSlices => "discovery.k8s.io/v1",
        }
    }
    fn kind(self) -> &'static str {
        match self {
            Self::Services => "Service",
            Self::EndpointSlices => "EndpointSlice",
            Self::Nodes => "Node",
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

fn matches(sel: Option<&str>, obj: &Value) -> bool {
    let Some(sel) = sel.filter(|s| !s.is_empty()) else { return true };
    sel.split(',').all(|term| match term.split_once('=') {
        Some(("metadata.name", v)) => obj["metadata"]["name"].as_str() == Some(v),
        Some(("metadata.namespace", v)) => obj["metadata"]["namespace"].as_str() == Some(v),
        _ => true,
    })
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
            .fallback(|| async { (StatusCode::NOT_FOUND, status(404, "NotFound", "not served").to_string()) })
            .with_state(inner.clone());
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.set_reuseaddr(true).expect("SO_REUSEADDR");
        socket.bind(addr).expect("bind fake apiserver");
        let listener = socket.listen(1024).expect("listen");
        let addr = listener.local_addr().expect("local addr");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { addr, inner, task }
    }

    /// The address it listens on.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The current resourceVersion (the last change's).
    pub(crate) fn resource_version(&self) -> u64 {
        self.inner.lock().rv
    }

    /// `http://127.0.0.1:PORT`.
    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kube client for it.
    pub(crate) fn client(&self) -> kube::Client {
        let cfg = kube::Config::new(self.url().parse().expect("url"));
        kube::Client::try_from(cfg).expect("client")
    }

    /// Creates or replaces an object (ADDED or MODIFIED); returns its resourceVersion.
    pub(crate) fn apply(&self, res: Res, mut obj: Value) -> u64 {
        let mut st = self.inner.lock();
        st.rv += 1;
        let rv = st.rv;
        obj["apiVersion"] = json!(res.api_version());
        obj["kind"] = json!(res.kind());
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        let key = key_of(res, &obj);
        let ty = if st.objects.insert(key, obj.clone()).is_some() { "MODIFIED" } else { "ADDED" };
        let ev = Ev { rv, res, ty, obj };
        st.history.push(ev.clone());
        let _ = self.inner.events.send(ev);
        rv
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
    let sel = q.get("fieldSelector").map(String::as_str);
    let all: Vec<&Value> =
        st.objects.iter().filter(|((r, _, _), o)| *r == res && matches(sel, o)).map(|(_, o)| o).collect();
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
    let sel = q.get("fieldSelector").cloned();
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
        let ok = |sel: &Option<String>, e: &Ev| e.res == res && matches(sel.as_deref(), &e.obj);
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
