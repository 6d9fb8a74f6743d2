//! `xlb`: a userspace AF_XDP L4 load balancer that replaces kube-proxy.
//!
//! Subcommands: `check` validates a config file and prints the tables it would program;
//! `run` runs the load balancer; `services`, `conntrack` and `stats` ask a running one over
//! its admin socket.
#![forbid(unsafe_code)]

mod admin;
mod detach;
mod handover;
mod notify;
mod run;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use dataplane::tables::TableBuilder;
use xlb::translate::Severity;

/// xlb: userspace AF_XDP L4 load balancer with kube-proxy semantics.
#[derive(Debug, Parser)]
#[command(name = "xlb", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Validate a config file without touching the network and print the tables it would
    /// program, in the layout of `ipvsadm -Ln`.
    ///
    /// Exits 0 when every object was programmed, 1 when the file cannot be loaded, the tables
    /// cannot be built, or some object (or part of one) had to be skipped (listed on stderr).
    Check {
        /// Multi-document YAML: one XlbConfiguration plus Service, EndpointSlice and Node
        /// objects as `kubectl get -o yaml` prints them.
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
    },
    /// Run the load balancer in standalone mode until SIGINT/SIGTERM. SIGHUP, or a change
    /// of FILE, reloads it atomically; a bad file is logged and the running tables stay.
    /// With $NOTIFY_SOCKET set (a systemd `Type=notify` unit) it sends `READY=1` and
    /// `MAINPID=` once it forwards and `STOPPING=1` when it drains or stops (sd_notify(3)).
    Run {
        /// The XlbConfiguration; in standalone mode (neither --kubernetes nor --kubeconfig)
        /// also the Service, EndpointSlice and Node objects.
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
        /// Watch the API server with in-cluster credentials (KUBERNETES_SERVICE_HOST/PORT
        /// must name the API server itself, not the `kubernetes` Service VIP).
        #[arg(long, conflicts_with = "kubeconfig")]
        kubernetes: bool,
        /// Watch the API server with this kubeconfig.
        #[arg(long, value_name = "PATH")]
        kubeconfig: Option<PathBuf>,
        /// Admin socket path.
        #[arg(long, value_name = "PATH", default_value = admin::DEFAULT_SOCKET)]
        admin_socket: PathBuf,
        /// Take over from the xlb running on the same admin socket (an upgrade or restart
        /// without losing flows): once this process's config and tables are ready, the running
        /// one stops, hands over its flows and detaches its programs, and this one attaches and
        /// serves them; the running one then exits, or idles with `--after-handover wait`. If
        /// none runs, start normally; if it refuses, exit with its answer (it keeps serving).
        #[arg(long)]
        takeover: bool,
        /// What this process does once it has handed over to a new xlb: `exit` (status 0), or
        /// `wait`: stay idle (no workers, programs, sockets or ports) until SIGTERM or SIGINT,
        /// then exit 0 at once. `wait` is for a container that is restarted when its process
        /// exits (a DaemonSet pod): it would take the node back with `--takeover`. A
        /// hand-over during the drain after SIGTERM always exits.
        #[arg(long, value_enum, value_name = "WHAT", default_value_t = run::AfterHandover::Exit)]
        after_handover: run::AfterHandover,
        /// With --takeover: start the new xlb as a child in its own session (this binary, the
        /// same arguments less --detach) and exit 0 once it serves, or 1 if it exits first.
        /// For a service manager's reload command (`ExecReload=` of the systemd unit); the
        /// child announces itself with `MAINPID=` on $NOTIFY_SOCKET.
        #[arg(long, requires = "takeover")]
        detach: bool,
    },
    /// Print the running tables with active/inactive connections, like `ipvsadm -Ln`.
    Services {
        /// Admin socket path.
        #[arg(long, value_name = "PATH", default_value = admin::DEFAULT_SOCKET)]
        admin_socket: PathBuf,
    },
    /// Dump the flow table, like `conntrack -L`.
    Conntrack {
        /// Admin socket path.
        #[arg(long, value_name = "PATH", default_value = admin::DEFAULT_SOCKET)]
        admin_socket: PathBuf,
    },
    /// Print per-worker counters (rx/tx, drops by reason, events, frame accounting) and
    /// packets per backend.
    Stats {
        /// Admin socket path.
        #[arg(long, value_name = "PATH", default_value = admin::DEFAULT_SOCKET)]
        admin_socket: PathBuf,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Check { config } => match check(&config) {
            Ok(code) => code,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::from(1)
            }
        },
        Command::Run { config, kubernetes, kubeconfig, admin_socket, takeover, after_handover, detach } => {
            if detach {
                return report(detach::run(std::env::args_os().skip(1), &admin_socket));
            }
            detach::leave_session_if_detached();
            let source = match (kubernetes, kubeconfig) {
                (_, Some(k)) => run::StateSource::Kubernetes { kubeconfig: Some(k) },
                (true, None) => run::StateSource::Kubernetes { kubeconfig: None },
                (false, None) => run::StateSource::File,
            };
            report(run::run(config, admin_socket, source, run::Options { takeover, after_handover }))
        }
        Command::Services { admin_socket } => ask(&admin_socket, "services"),
        Command::Conntrack { admin_socket } => ask(&admin_socket, "conntrack"),
        Command::Stats { admin_socket } => ask(&admin_socket, "stats"),
    }
}

fn report(r: anyhow::Result<()>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn ask(path: &std::path::Path, cmd: &str) -> ExitCode {
    match admin::request(path, cmd) {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// Loads the config file, naming the node from `$NODE_NAME` when the file does not.
pub(crate) fn load_config(path: &std::path::Path) -> Result<xlb::config::Loaded, xlb::config::LoadError> {
    let env = std::env::var(xlb::config::NODE_NAME_ENV).ok();
    xlb::config::load_file_for_node(path, env.as_deref())
}

/// `xlb check`: load, translate, build, print.
fn check(path: &std::path::Path) -> anyhow::Result<ExitCode> {
    let loaded = load_config(path)?;
    for n in &loaded.notes {
        eprintln!("note: {n}");
    }
    tracing::debug!(
        services = loaded.cluster.services.len(),
        endpoint_slices = loaded.cluster.endpoint_slices.len(),
        node = loaded.cluster.node.is_some(),
        "config file loaded"
    );
    let (spec, report) = xlb::translate::build_spec(&loaded.cluster, &loaded.config)?;
    tracing::debug!(
        specs = spec.services.len(),
        issues = report.issues.len(),
        no_local_internal = report.no_local_endpoints.internal,
        no_local_external = report.no_local_endpoints.external,
        "tables translated"
    );
    for i in &report.issues {
        eprintln!("{i}");
    }
    let tables = TableBuilder::new()
        .build(&spec)
        .map_err(|e| anyhow::anyhow!("{}: the tables cannot be built: {e}", path.display()))?;
    print!("{}", xlb::show::render(&tables));
    if !tables.unresolved.is_empty() {
        let list: Vec<String> = tables.unresolved.iter().map(ToString::to_string).collect();
        eprintln!(
            "note: no next hop in the config for backend(s) {}: `xlb run` follows the kernel's main \
             routing table and asks it for the neighbours (`xlb check` reads neither); `routes` \
             entries override the kernel's routes",
            list.join(", ")
        );
    }
    if loaded.config.announce.mode != xlb::config::AnnounceMode::None {
        let vips = xlb::announce::announced(&loaded.cluster, &spec, &xlb::announce::Scope::from_config(&loaded.config));
        eprintln!("note: announced while this node is healthy (announce.mode bgp): {vips}");
    }
    let errors = report.issues.iter().filter(|i| i.severity == Severity::Error).count();
    if errors > 0 {
        eprintln!("{}: {errors} object error(s); the objects named above are not (fully) programmed", path.display());
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}
