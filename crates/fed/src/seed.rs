/// A seed for one (round, client) task, derived from the run's seed with SplitMix64 so that
/// every random choice is pinned by the run seed yet independent of scheduling order.
pub fn derive_seed(seed: u64, round: usize, client: usize) -> u64 {
    let mut z = seed
        ^ (round as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ (client as u64).wrapping_mul(0xD1B5_4A32_D192_ED03);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distinct_per_task() {
        let mut seen = std::collections::HashSet::new();
        for r in 0..20 {
            for c in 0..50 {
                assert!(seen.insert(derive_seed(7, r, c)));
            }
        }
        assert_eq!(derive_seed(7, 3, 4), derive_seed(7, 3, 4));
    }
}
