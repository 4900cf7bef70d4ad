//! A progress bar on a terminal, plain lines elsewhere.

use std::io::IsTerminal;
use std::sync::Mutex;

use fedfuse_fed::Progress;
use indicatif::{ProgressBar, ProgressStyle};

/// Reports simulator progress.
pub struct Reporter {
    bar: Option<ProgressBar>,
    rounds: usize,
    lock: Mutex<()>,
}

impl Reporter {
    /// A bar when stderr is a terminal and `quiet` is off.
    pub fn new(rounds: usize, quiet: bool) -> Self {
        let bar = (!quiet && std::io::stderr().is_terminal()).then(|| {
            let bar = ProgressBar::new(0);
            let style = ProgressStyle::with_template(
                "round {msg} [{bar:30}] {pos}/{len} clients {elapsed_precise}",
            )
            .map(|s| s.progress_chars("=> "))
            .unwrap_or_else(|_| ProgressStyle::default_bar());
            bar.set_style(style);
            bar
        });
        Self {
            bar,
            rounds,
            lock: Mutex::new(()),
        }
    }

    /// Handles one event.
    pub fn event(&self, p: Progress<'_>) {
        match (p, &self.bar) {
            (Progress::RoundStart { round, clients }, Some(bar)) => {
                bar.reset();
                bar.set_length(clients as u64);
                bar.set_message(format!("{round}/{}", self.rounds));
            }
            (Progress::ClientDone { .. }, Some(bar)) => bar.inc(1),
            (Progress::RoundEnd(m), bar) => {
                let line = format!(
                    "round {}/{}: global accuracy {:.4}, loss {:.4}, local accuracy {:.4}, \
                     {} clients, {} rejected, {:.1} MB up, {:.1} MB down, {:.2} s",
                    m.round,
                    self.rounds,
                    m.global_accuracy,
                    m.global_loss,
                    m.local_accuracy_mean,
                    m.clients,
                    m.rejected.len(),
                    m.bytes_up as f64 / 1e6,
                    m.bytes_down as f64 / 1e6,
                    m.seconds
                );
                let _guard = self.lock.lock();
                match bar {
                    Some(bar) => bar.println(line),
                    None => eprintln!("{line}"),
                }
                for r in &m.rejected {
                    let msg = format!("  rejected client {}: {}", r.client, r.reason);
                    match bar {
                        Some(bar) => bar.println(msg),
                        None => eprintln!("{msg}"),
                    }
                }
            }
            _ => {}
        }
    }

    /// Removes the bar.
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
