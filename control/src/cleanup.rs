//! `xlb cleanup`: removes what an xlb that did not stop cleanly (SIGKILL, OOM kill, a crash)
//! left behind, as kube-proxy's `--cleanup` does for its rules (seed CLN-01). A clean stop
//! leaves nothing, and the next `xlb run` replaces the leftovers itself; this is for a node
//! where xlb will not run again.
//!
//! What it removes, in the calling process's network namespace: the steering program on each
//! interface of the config (only xlb's: the id recorded in `<admin socket>.xdp`, or the
//! program name `xlb_steer`), xlb's policy rules (`nic_config::rules::remove_leftovers`), the
//! record file and the admin socket file. The punt device went with the process. It refuses,
//! before it removes anything, while an xlb answers on the admin socket, a running process
//! holds an interface's program, or a punt device of xlb's rules exists (a running xlb's).

use std::path::Path;

use anyhow::{Context as _, Result, bail};

/// Runs the cleanup for the interfaces of the config file `config` and the admin socket
/// `admin_socket`, printing one line per thing removed.
///
/// # Errors
/// An xlb still runs (on the socket, holding an interface's program, or owning a punt
/// device); the config cannot
/// be loaded; netlink fails (what was removed before stays removed).
pub(crate) fn run(config: &Path, admin_socket: &Path) -> Result<()> {
    if std::os::unix::net::UnixStream::connect(admin_socket).is_ok() {
        bail!("an xlb is running on admin socket {} (stop it: a clean stop leaves nothing)", admin_socket.display());
    }
    let loaded = crate::load_config(config).with_context(|| format!("loading {}", config.display()))?;
    let record_path = admin_socket.with_extension("xdp");
    let recorded = std::fs::read_to_string(&record_path).unwrap_or_default();
    let recorded_id = |ifname: &str| {
        recorded.lines().find_map(|l| l.strip_prefix(ifname)?.strip_prefix(' ')?.trim().parse::<u32>().ok())
    };
    let ifnames: Vec<&str> = loaded.config.interfaces.iter().map(|i| i.name.as_str()).collect();
    for ifname in &ifnames {
        let Some(prog) = nic_config::interface_info(ifname)?.xdp_prog_id else { continue };
        if let Some(pid) = nic_config::program_holders(prog).first() {
            bail!("interface {ifname}: its XDP program {prog} is held by running process {pid}; stop it first");
        }
    }
    // The policy rules are the namespace's, not an interface's: an xlb running on another
    // admin socket and other interfaces would lose its own. Its punt device lives as long as
    // it does (a TUN device goes with its process, even on SIGKILL), so a bypass rule whose
    // device exists belongs to a running xlb.
    for dev in nic_config::rules::bypass_devices()? {
        if nic_config::ifindex(&dev).is_ok() {
            bail!(
                "punt device {dev} exists: an xlb runs in this network namespace (on another admin socket?); stop it first"
            );
        }
    }
    for ifname in &ifnames {
        match nic_config::detach_leftover(ifname, recorded_id(ifname))? {
            Some(prog) => println!("{ifname}: detached the steering program {prog}"),
            None => println!("{ifname}: no xlb steering program attached"),
        }
    }
    let (bypass, reply) = nic_config::rules::remove_leftovers(None)?;
    println!("policy rules removed: {bypass} bypass, {reply} reply");
    for file in [&record_path, &admin_socket.to_path_buf()] {
        match std::fs::remove_file(file) {
            Ok(()) => println!("removed {}", file.display()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("removing {}", file.display())),
        }
    }
    Ok(())
}
