//! Which clients take part in each round: the same draw in the simulator and the Flower
//! strategy.

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use super::{Sampling, SimConfig};
use crate::Result;

/// Which clients take part in each round, drawn with the run's seed as `cfg.sampling` says,
/// in increasing order. The simulator and the Flower strategy draw the same sequence.
pub struct Sampler {
    rng: StdRng,
    n: usize,
    draw: Draw,
}

enum Draw {
    Fixed(usize),
    Poisson(f64),
}

impl Sampler {
    /// The sampler of a run of `cfg` over `n` clients.
    pub fn new(cfg: &SimConfig, n: usize) -> Result<Self> {
        let draw = match cfg.sampling {
            Sampling::Fixed => Draw::Fixed(cfg.sample_size(n)?),
            Sampling::Poisson => Draw::Poisson(cfg.sampling_rate(n)?),
        };
        Ok(Self {
            rng: StdRng::seed_from_u64(cfg.seed),
            n,
            draw,
        })
    }

    /// The next round's clients, in increasing order.
    pub fn next_round(&mut self) -> Vec<usize> {
        match self.draw {
            Draw::Fixed(k) => {
                let mut sampled = rand::seq::index::sample(&mut self.rng, self.n, k).into_vec();
                sampled.sort_unstable();
                sampled
            }
            Draw::Poisson(q) => (0..self.n)
                .filter(|_| self.rng.random::<f64>() < q)
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulator::ClientsPerRound;

    #[test]
    fn poisson_sampling_draws_each_client_at_its_rate_and_replays_by_seed() {
        let cfg = SimConfig {
            clients_per_round: ClientsPerRound::Fraction(0.3),
            sampling: Sampling::Poisson,
            seed: 5,
            ..SimConfig::default()
        };
        let mut sampler = Sampler::new(&cfg, 50).unwrap();
        let rounds: Vec<Vec<usize>> = (0..400).map(|_| sampler.next_round()).collect();
        let drawn: usize = rounds.iter().map(Vec::len).sum();
        // 400 x 50 Bernoulli(0.3) draws: mean 6000, sd 65.
        assert!((drawn as f64 - 6000.0).abs() < 300.0, "{drawn}");
        let sizes: std::collections::BTreeSet<usize> = rounds.iter().map(Vec::len).collect();
        assert!(sizes.len() > 5, "{sizes:?}");
        assert!(rounds.iter().all(|r| r.windows(2).all(|w| w[0] < w[1])));
        let mut again = Sampler::new(&cfg, 50).unwrap();
        assert!(rounds.iter().all(|r| *r == again.next_round()));
        // A count is a rate of count / n.
        let count = SimConfig {
            clients_per_round: ClientsPerRound::Count(10),
            ..cfg
        };
        assert_eq!(count.sampling_rate(50).unwrap(), 0.2);
    }
}
