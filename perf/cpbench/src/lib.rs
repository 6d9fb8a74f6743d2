//! xlb control-plane scale benchmark, and the kube-proxy rulesets it compares against.
//!
//! - [`nft`] / [`iptables`]: from the same inputs xlb uses (the config file of
//!   [`xlb::file_source::load_file`], translated by [`xlb::translate::build_spec`]), the ruleset
//!   kube-proxy's nftables or iptables mode would program (`pkg/proxy/nftables/proxier.go`,
//!   `pkg/proxy/iptables/proxier.go` in kubernetes/kubernetes), and the nftables partial-sync
//!   transaction for one changed Service. Bin `kube-proxy-rules`.
//! - [`synth`] / [`bench`](mod@bench): synthetic clusters of k8s-openapi objects and the timings and
//!   memory of xlb's table builds, full and after one EndpointSlice change, next to `nft -f`
//!   of kube-proxy's ruleset. Bin `xlb-cpbench`.
#![deny(unsafe_code)]

pub mod alloc_count;
pub mod bench;
pub mod iptables;
pub mod model;
pub mod names;
pub mod netns;
pub mod nft;
pub mod synth;

use std::path::Path;

use dataplane::tables::TablesSpec;

/// Which kube-proxy mode's ruleset to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `nft -f` input: `table ip kube-proxy` (and `ip6` when there are IPv6 services).
    Nftables,
    /// `iptables-restore` input of one family.
    Iptables(iptables::Family),
}

/// Why a ruleset could not be generated from a config file.
#[derive(Debug, thiserror::Error)]
pub enum RulesError {
    /// The config file did not load.
    #[error(transparent)]
    Load(#[from] xlb::file_source::LoadError),
    /// The configuration is invalid for translation.
    #[error(transparent)]
    Translate(#[from] xlb::translate::TranslateError),
    /// The translated spec has a shape the kube-proxy model does not know.
    #[error(transparent)]
    Model(#[from] model::ModelError),
}

/// Translates the objects of a loaded config file with xlb's own translation.
///
/// # Errors
/// [`RulesError::Translate`] for an invalid configuration.
pub fn spec_of(loaded: &xlb::file_source::Loaded) -> Result<(TablesSpec, xlb::translate::TranslateReport), RulesError> {
    Ok(xlb::translate::build_spec(&loaded.cluster, &loaded.config)?)
}

/// The ruleset of `mode` for the Services of a translated spec.
///
/// # Errors
/// [`RulesError::Model`] for spec names `build_spec` never produces.
pub fn ruleset(spec: &TablesSpec, mode: Mode) -> Result<String, RulesError> {
    Ok(match mode {
        Mode::Nftables => nft::nft_ruleset(spec)?,
        Mode::Iptables(f) => iptables::iptables_ruleset(spec, f)?,
    })
}

/// Loads `path` (an xlb config file), translates it and returns the ruleset of `mode` plus
/// the translation report (objects that were skipped are not in the ruleset either).
///
/// # Errors
/// [`RulesError`] when the file does not load or translate.
pub fn ruleset_from_file(path: &Path, mode: Mode) -> Result<(String, xlb::translate::TranslateReport), RulesError> {
    let loaded = xlb::file_source::load_file(path)?;
    let (spec, report) = spec_of(&loaded)?;
    Ok((ruleset(&spec, mode)?, report))
}
