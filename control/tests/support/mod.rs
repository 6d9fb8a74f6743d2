//! Test support: the fake API server, object builders and a tiny HTTP client.
#![allow(dead_code, reason = "shared by several test binaries, each of which uses a part")]

pub(crate) mod fake_apiserver;

use std::net::SocketAddr;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A directory of a test's files under the system's temporary directory
/// (`xlb-{tag}-{pid}`), emptied when made and removed when dropped (also when the test fails).
pub(crate) struct TempDir(pub(crate) std::path::PathBuf);

impl TempDir {
    pub(crate) fn new(tag: &str) -> Self {
        let d = std::env::temp_dir().join(format!("xlb-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("temp dir");
        Self(d)
    }

    /// Writes `text` into file `name` of the directory; returns its path.
    pub(crate) fn write(&self, name: &str, text: &str) -> std::path::PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, text).expect("write");
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Our node's name.
pub(crate) const NODE: &str = "node-a";

/// A ClusterIP Service with TCP ports `(name, port, targetPort)`.
pub(crate) fn service(ns: &str, name: &str, cluster_ip: &str, ports: &[(&str, i32, i32)]) -> Value {
    json!({
        "metadata": {"namespace": ns, "name": name},
        "spec": {
            "type": "ClusterIP",
            "clusterIP": cluster_ip,
            "clusterIPs": [cluster_ip],
            "ports": ports.iter().map(|(n, p, t)| json!({"name": n, "port": p, "targetPort": t, "protocol": "TCP"})).collect::<Vec<_>>(),
        }
    })
}

/// An IPv4 EndpointSlice of Service `svc` with endpoints `(address, ready, nodeName)` and
/// ports `(name, port)`.
pub(crate) fn slice(ns: &str, name: &str, svc: &str, endpoints: &[(&str, bool, &str)], ports: &[(&str, i32)]) -> Value {
    json!({
        "metadata": {"namespace": ns, "name": name, "labels": {"kubernetes.io/service-name": svc}},
        "addressType": "IPv4",
        "endpoints": endpoints.iter().map(|(a, r, n)| json!({
            "addresses": [a], "conditions": {"ready": r, "serving": r, "terminating": false}, "nodeName": n
        })).collect::<Vec<_>>(),
        "ports": ports.iter().map(|(n, p)| json!({"name": n, "port": p, "protocol": "TCP"})).collect::<Vec<_>>(),
    })
}

/// A kubeconfig whose current context points at `server` (e.g. the fake API server's
/// `http://127.0.0.1:PORT`), without credentials.
pub(crate) fn kubeconfig(server: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster: {{server: \"{server}\"}}\ncontexts:\n- name: fake\n  context: {{cluster: fake, user: fake}}\ncurrent-context: fake\nusers:\n- name: fake\n  user: {{}}\n"
    )
}

/// A Node with one InternalIP.
pub(crate) fn node(name: &str, ip: &str) -> Value {
    json!({
        "metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": "zone-a"}},
        "status": {"addresses": [{"type": "InternalIP", "address": ip}]}
    })
}

/// A plain HTTP/1.1 GET: (status, headers, body).
pub(crate) async fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String, String)> {
    http_get_with(addr, path, "").await
}

/// A plain HTTP/1.1 GET with extra header lines (each ending in `\r\n`).
pub(crate) async fn http_get_with(
    addr: SocketAddr,
    path: &str,
    headers: &str,
) -> std::io::Result<(u16, String, String)> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{headers}Connection: close\r\n\r\n").as_bytes())
        .await?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    Ok((code, head.to_owned(), body.to_owned()))
}
