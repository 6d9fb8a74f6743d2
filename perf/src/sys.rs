//! Process plumbing shared by the binaries: entering `ip netns` namespaces, CPU pinning and
//! the CLOCK_MONOTONIC nanosecond clock the generator stamps into its payloads.

use std::fs::File;
use std::path::PathBuf;

use anyhow::Context as _;
use nix::sched::CloneFlags;
use nix::time::ClockId;

/// Moves the *calling thread* into the network namespace `name`: an `ip netns` name (looked
/// up as `/run/netns/NAME`) or, if it contains a `/`, a path such as `/proc/PID/ns/net`.
/// AF_XDP sockets bind to an ifindex of the caller's namespace, so sockets opened by this
/// thread afterwards belong to `name`. Other threads are not affected.
///
/// # Errors
/// The namespace file cannot be opened or `setns(2)` fails (e.g. not root).
pub fn enter_netns(name: &str) -> anyhow::Result<()> {
    let path = if name.contains('/') { PathBuf::from(name) } else { PathBuf::from("/run/netns").join(name) };
    let f = File::open(&path).with_context(|| format!("opening network namespace {}", path.display()))?;
    nix::sched::setns(&f, CloneFlags::CLONE_NEWNET).with_context(|| format!("setns into {}", path.display()))?;
    Ok(())
}

/// Moves the calling thread into the network namespace of an open namespace file (e.g. one
/// opened from `/proc/thread-self/ns/net` earlier, to come back).
///
/// # Errors
/// `setns(2)` fails.
pub fn enter_netns_file(f: &File) -> anyhow::Result<()> {
    nix::sched::setns(f, CloneFlags::CLONE_NEWNET).context("setns back into the original namespace")?;
    Ok(())
}

/// Pins the calling thread to CPU `cpu`.
///
/// # Errors
/// The CPU does not exist or is not in the allowed set.
pub fn pin_cpu(cpu: usize) -> anyhow::Result<()> {
    anyhow::ensure!(
        core_affinity::set_for_current(core_affinity::CoreId { id: cpu }),
        "cannot pin to CPU {cpu} (not online or not allowed)"
    );
    Ok(())
}

/// CLOCK_MONOTONIC in nanoseconds (system-wide, the same in every network namespace; vDSO,
/// no system call).
#[inline]
pub fn mono_ns() -> u64 {
    // CLOCK_MONOTONIC cannot fail (EINVAL/EFAULT only for bad arguments).
    nix::time::clock_gettime(ClockId::CLOCK_MONOTONIC).map_or(0, |ts| {
        let s = u64::try_from(ts.tv_sec()).unwrap_or(0);
        let ns = u64::try_from(ts.tv_nsec()).unwrap_or(0);
        s * 1_000_000_000 + ns
    })
}

/// Parses a MAC address written as six hex bytes separated by `:` or `-`.
///
/// # Errors
/// Anything else.
pub fn parse_mac(s: &str) -> Result<[u8; 6], String> {
    let parts: Vec<&str> = s.split([':', '-']).collect();
    if parts.len() != 6 {
        return Err(format!("MAC address {s:?}: expected six hex bytes like 02:00:00:00:00:01"));
    }
    let mut mac = [0u8; 6];
    for (b, p) in mac.iter_mut().zip(&parts) {
        if p.is_empty() || p.len() > 2 {
            return Err(format!("MAC address {s:?}: bad byte {p:?}"));
        }
        *b = u8::from_str_radix(p, 16).map_err(|_| format!("MAC address {s:?}: bad byte {p:?}"))?;
    }
    Ok(mac)
}

/// The MAC address of interface `ifname` in the caller's network namespace, from
/// `/sys/class/net/IF/address` (under `ip netns exec`, /sys is that namespace's).
///
/// # Errors
/// No such interface or an unreadable address.
pub fn iface_mac(ifname: &str) -> anyhow::Result<[u8; 6]> {
    let path = format!("/sys/class/net/{ifname}/address");
    let s = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    parse_mac(s.trim()).map_err(anyhow::Error::msg)
}

/// Formats a MAC address as `aa:bb:cc:dd:ee:ff`.
pub fn format_mac(m: &[u8; 6]) -> String {
    format!("{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", m[0], m[1], m[2], m[3], m[4], m[5])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_round_trip_and_errors() {
        let m = parse_mac("02:0a:FF:00:10:9b").unwrap();
        assert_eq!(m, [0x02, 0x0a, 0xff, 0x00, 0x10, 0x9b]);
        assert_eq!(format_mac(&m), "02:0a:ff:00:10:9b");
        assert_eq!(parse_mac("02-0a-ff-00-10-9b").unwrap(), m);
        assert!(parse_mac("02:0a:ff:00:10").is_err());
        assert!(parse_mac("02:0a:ff:00:10:9b:00").is_err());
        assert!(parse_mac("02:0a:ff:00:10:zz").is_err());
        assert!(parse_mac("02:0a:ff:00:10:100").is_err());
    }

    #[test]
    fn clock_is_monotonic_and_nanoseconds() {
        let a = mono_ns();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = mono_ns();
        assert!(b > a + 1_000_000, "{a} {b}");
        assert!(b - a < 5_000_000_000);
    }
}
