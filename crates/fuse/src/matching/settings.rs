//! The matcher's priors and iterations, the one settings type that PFNM's, GPI-FNM's and
//! FedMA's method tables, the sweep's `[matching]`, `fedfuse fuse`'s flags and the Python
//! package's keywords all take (flattened into each), and the one home of their defaults.

use std::collections::BTreeMap;

use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};

use crate::{FuseError, Result};

/// Most refinement passes a matching may ask for (`iters`): bounds the time a setting can
/// cost, since orders are drawn for every pass even after the matching settles.
pub const MAX_ITERS: usize = 10_000;

/// The reference code's soft cap on a global layer's width.
const MAX_GLOBAL: usize = 700;

/// How the matcher weighs client units against global ones, and how long it refines.
/// `sigma` and `sigma0` are **variances**, as in the PFNM reference code.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
#[serde(default)]
pub struct MatchPrior {
    /// Variance of client units around their global unit (reference default 1).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = MatchPrior::default().sigma))]
    pub sigma: f64,
    /// Prior variance of global units (reference default 1).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = MatchPrior::default().sigma0))]
    pub sigma0: f64,
    /// Mass of the Beta process: larger opens new global units more readily (default 1).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = MatchPrior::default().gamma))]
    pub gamma: f64,
    /// Refinement passes per layer after the greedy pass (5 in single-round PFNM).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = MatchPrior::default().iters))]
    pub iters: usize,
    /// Soft cap on each global layer's width (700 in the reference): past it, no new global
    /// unit opens. Left out of a written config when it is the default.
    #[cfg_attr(
        feature = "clap",
        arg(long, default_value_t = MatchPrior::default().max_global)
    )]
    #[serde(skip_serializing_if = "MatchPrior::default_max_global")]
    pub max_global: usize,
}

impl Default for MatchPrior {
    fn default() -> Self {
        Self {
            sigma: 1.0,
            sigma0: 1.0,
            gamma: 1.0,
            iters: 5,
            max_global: MAX_GLOBAL,
        }
    }
}

impl MatchPrior {
    /// The keys of a table this type is flattened into, for the error on an unknown one.
    pub const KEYS: [&str; 5] = ["sigma", "sigma0", "gamma", "iters", "max_global"];

    fn default_max_global(v: &usize) -> bool {
        *v == MAX_GLOBAL
    }

    /// Checks every setting, naming the first that is out of range.
    pub fn check(&self) -> Result<()> {
        let positive = [
            ("sigma", self.sigma),
            ("sigma0", self.sigma0),
            ("gamma", self.gamma),
        ];
        for (field, v) in positive {
            if !(v.is_finite() && v > 0.0) {
                return Err(FuseError::InvalidSetting {
                    field,
                    reason: format!("{v} is not a positive finite number"),
                });
            }
        }
        if self.max_global == 0 {
            return Err(FuseError::InvalidSetting {
                field: "max_global",
                reason: "must be at least 1".into(),
            });
        }
        if self.iters > MAX_ITERS {
            return Err(FuseError::InvalidSetting {
                field: "iters",
                reason: format!(
                    "{} is above {MAX_ITERS}: a matching settles within a few dozen passes",
                    self.iters
                ),
            });
        }
        Ok(())
    }
}

/// The keys of a table that no field took, gathered by a `#[serde(flatten)]` field of this
/// type declared after the table's other fields: serde's `deny_unknown_fields` does not work
/// beside a flattened field, so a table holding a [`MatchPrior`] names its unknown keys with
/// [`UnknownKeys::refuse`] where it is read.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(transparent)]
pub struct UnknownKeys(BTreeMap<String, IgnoredAny>);

impl UnknownKeys {
    /// Refuses the first unknown key as serde's own unknown-field error does, listing
    /// `expected` (the table's keys).
    pub fn refuse<E: serde::de::Error>(
        &self,
        expected: &'static [&'static str],
    ) -> std::result::Result<(), E> {
        match self.0.keys().next() {
            Some(key) => Err(E::unknown_field(key, expected)),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_the_fields_serde_writes() {
        let prior = MatchPrior {
            max_global: 3,
            ..MatchPrior::default()
        };
        let value = serde_json::to_value(prior).unwrap();
        let mut written: Vec<&str> = value
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        written.sort_unstable();
        let mut keys = MatchPrior::KEYS.to_vec();
        keys.sort_unstable();
        assert_eq!(written, keys);
    }

    #[test]
    fn out_of_range_settings_are_named() {
        let bad = |p: MatchPrior| match p.check() {
            Err(FuseError::InvalidSetting { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        let d = MatchPrior::default();
        assert_eq!(bad(MatchPrior { sigma0: 0.0, ..d }), "sigma0");
        assert_eq!(
            bad(MatchPrior {
                gamma: f64::NAN,
                ..d
            }),
            "gamma"
        );
        assert_eq!(bad(MatchPrior { max_global: 0, ..d }), "max_global");
        assert_eq!(
            bad(MatchPrior {
                iters: MAX_ITERS + 1,
                ..d
            }),
            "iters"
        );
        d.check().unwrap();
    }
}
