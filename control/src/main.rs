//! `xlb`: a userspace AF_XDP L4 load balancer that replaces kube-proxy.
//!
//! Subcommands: `check` validates a config file and prints the tables it would program;
//! `run` runs the load balancer; `cleanup` removes what a killed one left behind; `crd` prints the CRD of the XlbIPPool address pools;
//! `services`, `conntrack`, `stats` and `monitor` ask a running one over its admin socket; `trace` runs
//! a capture (or one flow) through the pipeline offline; `completions` and `man` print a shell
//! completion script and the man page, both generated from these clap definitions.
#![forbid(unsafe_code)]

mod admin;
mod cleanup;
mod detach;
mod handover;
mod monitor;
mod notify;
mod run;
mod trace;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};
use dataplane::tables::TableBuilder;
use xlb::translate::Severity;

/// `xlb --version`: the crate version and the commit it was built from (`build.rs`).
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("XLB_COMMIT"), ")");

/// xlb: userspace AF_XDP L4 load balancer with kube-proxy semantics.
#[derive(Debug, Parser)]
#[command(
    name = "xlb",
    version = VERSION,
    about = "A userspace AF_XDP L4 load balancer with kube-proxy's Service semantics",
    long_about = None
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// `xlb trace` subcommands.
#[derive(Debug, Subcommand)]
enum TraceWhat {
    /// Which backend a new flow gets (its first packet through a fresh pipeline).
    Flow {
        /// Client `ADDRESS:PORT` (IPv6 in brackets).
        src: std::net::SocketAddr,
        /// Frontend `ADDRESS:PORT/PROTO`, PROTO tcp, udp or sctp.
        dst: String,
        /// Multi-document YAML, as for `check`.
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
        /// A JSON object instead of a line.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Validate a config file without touching the network and print the tables it would
    /// program, in the layout of `ipvsadm -Ln`, then each Maglev lookup table's size and
    /// checksum (the `xlb_maglev_table_checksum` metric), so two hosts' tables compare with
    /// `diff`.
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
    /// Remove what an xlb that did not stop cleanly (kill -9, OOM kill) left behind: the
    /// steering program on each interface of FILE, the policy rules, the program record and
    /// the admin socket. Refuses while an xlb runs. A clean stop leaves nothing, and the next
    /// `xlb run` replaces the leftovers itself; this is for a node where xlb will not run
    /// again (kube-proxy's `--cleanup`).
    Cleanup {
        /// The XlbConfiguration whose `interfaces` are cleaned.
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
        /// Admin socket path of the xlb that left them.
        #[arg(long, value_name = "PATH", default_value = admin::DEFAULT_SOCKET)]
        admin_socket: PathBuf,
    },
    /// Print the CustomResourceDefinition of the XlbIPPool address pools (YAML), generated
    /// from xlb's own type; `deploy/kubernetes/crd-xlbippools.yaml` is this output.
    Crd,
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
    /// Run every frame of a capture through the real pipeline, offline, over the tables of a
    /// config file (as `check` builds them), conntrack carried from frame to frame and the
    /// clock taken from the capture. Prints one line per frame: 5-tuple, frontend, conntrack
    /// (hit, new, miss), backend, action (dnat, snat, dsr, reply, reject, rst, icmp, pass,
    /// drop + reason) and events. `xlb trace flow SRC:PORT DST:PORT/PROTO --config FILE`
    /// answers which backend a new flow gets.
    #[command(args_conflicts_with_subcommands = true)]
    Trace {
        #[command(subcommand)]
        what: Option<TraceWhat>,
        /// Multi-document YAML, as for `check`.
        #[arg(long, value_name = "FILE", required = true)]
        config: Option<PathBuf>,
        /// The capture: pcap or pcapng, Ethernet frames.
        #[arg(long = "in", value_name = "IN.pcap[ng]", required = true)]
        input: Option<PathBuf>,
        /// Write the frames as the pipeline left them (the input for pass and drop) here, as
        /// pcapng with each frame's verdict as its packet comment.
        #[arg(long, value_name = "OUT.pcapng")]
        out: Option<PathBuf>,
        /// One JSON object per frame instead of a line.
        #[arg(long)]
        json: bool,
        /// Seed of the pipeline's random choices (the `random` scheduler, hash keys), so a
        /// trace is reproducible.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// MAC of every interface, the source MAC of transmitted frames (`xlb run` reads the
        /// interface's own).
        #[arg(long, value_name = "MAC", default_value = "00:00:00:00:00:00", value_parser = trace::parse_mac)]
        mac: [u8; 6],
    },
    /// Show the frames the running xlb drops, live, with their drop reason, until interrupted
    /// (or --count frames). While no monitor runs, the workers' only cost is one flag checked
    /// per dropped frame; while one does, each dropped frame's first 256 bytes are copied to
    /// a bounded queue per worker (full: the copy is skipped and counted), and at most 10,000
    /// frames a second are sent.
    Monitor {
        /// Dropped frames (the only kind so far; required).
        #[arg(long, required = true)]
        drops: bool,
        /// Copy one dropped frame in N.
        #[arg(long, value_name = "N", default_value_t = 1)]
        sample: u32,
        /// Also the frames the workers hand to the kernel (not xlb's: direct traffic of pods
        /// that back a Service, frames the steering program sent that xlb does not handle).
        #[arg(long)]
        punted: bool,
        /// Only frames to this VIP (and port): ADDRESS/PORT or ADDRESS.
        #[arg(long, value_name = "VIP/PORT", value_parser = monitor::parse_filter)]
        filter: Option<monitor::Filter>,
        /// Also write the frames to this pcapng file, each with its reason as packet comment.
        #[arg(short = 'w', value_name = "FILE.pcapng")]
        write: Option<PathBuf>,
        /// Stop after this many frames (0: never).
        #[arg(long, default_value_t = 0)]
        count: u64,
        /// Admin socket path.
        #[arg(long, value_name = "PATH", default_value = admin::DEFAULT_SOCKET)]
        admin_socket: PathBuf,
    },
    /// Print a completion script for SHELL to stdout, e.g.
    /// `xlb completions bash > /usr/share/bash-completion/completions/xlb`.
    Completions {
        /// bash, elvish, fish, powershell or zsh.
        shell: clap_complete::Shell,
    },
    /// Print the man page xlb(1) (roff) to stdout, or with --dir write it and one page per
    /// subcommand (xlb-check(1), xlb-run(1), ...) into DIR.
    Man {
        /// Directory to write xlb.1 and xlb-SUBCOMMAND.1 into, e.g. /usr/share/man/man1.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
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
        Command::Trace { what: Some(TraceWhat::Flow { src, dst, config, json }), .. } => {
            let parsed = dst.rsplit_once('/').and_then(|(a, p)| Some((a.parse::<std::net::SocketAddr>().ok()?, p)));
            let Some((dst, proto)) = parsed else {
                eprintln!("error: {dst:?}: expected ADDRESS:PORT/PROTO, e.g. 10.96.0.10:80/tcp or [fd00::10]:53/udp");
                return ExitCode::from(2);
            };
            report(trace::run_flow(&config, src, dst, proto, json))
        }
        Command::Trace { what: None, config, input, out, json, seed, mac } => match (config, input) {
            (Some(config), Some(input)) => report(trace::run_capture(&config, &input, out.as_deref(), json, seed, mac)),
            _ => {
                eprintln!("error: xlb trace needs --config and --in (or: xlb trace flow ...)");
                ExitCode::from(2)
            }
        },
        Command::Monitor { drops: _, sample, punted, filter, write, count, admin_socket } => {
            report(monitor::run(&admin_socket, sample, punted, filter, write.as_deref(), count))
        }
        Command::Completions { shell } => {
            // Into memory first: `generate` panics when its writer fails (a closed pipe).
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "xlb", &mut out);
            write_stdout(&out)
        }
        Command::Man { dir: Some(dir) } => match clap_mangen::generate_to(Cli::command(), &dir) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: cannot write the man pages into {}: {e}", dir.display());
                ExitCode::from(1)
            }
        },
        Command::Man { dir: None } => {
            let mut out = Vec::new();
            match clap_mangen::Man::new(Cli::command()).render(&mut out) {
                Ok(()) => write_stdout(&out),
                Err(e) => {
                    eprintln!("error: cannot render the man page: {e}");
                    ExitCode::from(1)
                }
            }
        }
        Command::Cleanup { config, admin_socket } => report(cleanup::run(&config, &admin_socket)),
        Command::Crd => match xlb::ipam::crd_yaml() {
            Ok(y) => {
                print_out(&y);
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(1)
            }
        },
        Command::Services { admin_socket } => ask(&admin_socket, "services"),
        Command::Conntrack { admin_socket } => ask(&admin_socket, "conntrack"),
        Command::Stats { admin_socket } => ask(&admin_socket, "stats"),
    }
}

/// Prints `s` to stdout. A reader that stopped reading (`xlb check ... | head`) is not an error:
/// the rest is dropped and the command goes on to its own exit code, as a shell tool ended by
/// SIGPIPE would be quiet; `print!` panics there (Rust ignores SIGPIPE). Other write errors are
/// reported on stderr.
pub(crate) fn print_out(s: &str) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(s.as_bytes()).and_then(|()| out.flush())
        && e.kind() != std::io::ErrorKind::BrokenPipe
    {
        eprintln!("error: writing to stdout: {e}");
    }
}

/// Writes `bytes` to stdout; exit code 1 if it cannot (e.g. the reader went away).
fn write_stdout(bytes: &[u8]) -> ExitCode {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) => ExitCode::from(1),
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
            print_out(&out);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// Loads the config file, naming the node from `$NODE_NAME` when the file does not.
pub(crate) fn load_config(path: &std::path::Path) -> Result<xlb::file_source::Loaded, xlb::file_source::LoadError> {
    let env = std::env::var(xlb::file_source::NODE_NAME_ENV).ok();
    xlb::file_source::load_file_for_node(path, env.as_deref())
}

/// Reloads the config file (as [`load_config`]); the file's LoadBalancer Services keep the
/// pool addresses they hold in `previous`.
pub(crate) fn reload_config(
    path: &std::path::Path,
    previous: &xlb::cluster::ClusterState,
) -> Result<xlb::file_source::Loaded, xlb::file_source::LoadError> {
    let env = std::env::var(xlb::file_source::NODE_NAME_ENV).ok();
    xlb::file_source::reload_file_for_node(path, env.as_deref(), previous)
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
    print_out(&xlb::show::render(&tables));
    print_out(&xlb::show::render_maglev(&tables));
    if !tables.unresolved.is_empty() {
        let mut list: Vec<std::net::IpAddr> = tables.unresolved.iter().copied().collect();
        list.sort_unstable();
        let list: Vec<String> = list.iter().map(ToString::to_string).collect();
        eprintln!(
            "note: no next hop in the config for backend(s) {}: `xlb run` follows the kernel's main \
             routing table and asks it for the neighbours (`xlb check` reads neither); `routes` \
             entries override the kernel's routes",
            list.join(", ")
        );
    }
    if loaded.config.announce.mode != xlb::config::AnnounceMode::None {
        let vips = xlb::announce::announced(&loaded.cluster, &spec, &xlb::announce::Scope::from_config(&loaded.config));
        let mode = format!("{:?}", loaded.config.announce.mode).to_lowercase();
        eprintln!("note: announced while this node is healthy (announce.mode {mode}): {vips}");
    }
    let errors = report.issues.iter().filter(|i| i.severity == Severity::Error).count();
    if errors > 0 {
        eprintln!("{}: {errors} object error(s); the objects named above are not (fully) programmed", path.display());
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}
