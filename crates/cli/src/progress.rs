//! A progress bar on a terminal, plain lines elsewhere: the binary's [`Observer`].

use std::io::IsTerminal;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use fedfuse_fed::Progress;
use fedfuse_lab::Observer;
use indicatif::{ProgressBar, ProgressStyle};

/// Reports experiment progress on stderr.
pub struct Reporter {
    /// Bars only when asked for and stderr is a terminal.
    bars: bool,
    bar: Mutex<Option<ProgressBar>>,
    rounds: AtomicUsize,
}

impl Reporter {
    /// Bars when stderr is a terminal and `quiet` is off; plain lines otherwise.
    pub fn new(quiet: bool) -> Self {
        Self {
            bars: !quiet && std::io::stderr().is_terminal(),
            bar: Mutex::new(None),
            rounds: AtomicUsize::new(0),
        }
    }

    /// Prints `line` above the bar, or plainly.
    fn println(&self, line: &str) {
        let bar = self.bar.lock().unwrap_or_else(|e| e.into_inner());
        match bar.as_ref() {
            Some(bar) => bar.println(line),
            None => eprintln!("{line}"),
        }
    }
}

impl Observer for Reporter {
    fn run_started(&self, rounds: usize) {
        self.rounds.store(rounds, Ordering::Relaxed);
        if !self.bars {
            return;
        }
        let bar = ProgressBar::new(0);
        let style = ProgressStyle::with_template(
            "round {msg} [{bar:30}] {pos}/{len} clients {elapsed_precise}",
        )
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        *self.bar.lock().unwrap_or_else(|e| e.into_inner()) = Some(bar);
    }

    fn progress(&self, p: Progress<'_>) {
        let rounds = self.rounds.load(Ordering::Relaxed);
        match p {
            Progress::RoundStart { round, clients } => {
                if let Some(bar) = self.bar.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
                    bar.reset();
                    bar.set_length(clients as u64);
                    bar.set_message(format!("{round}/{rounds}"));
                }
            }
            Progress::ClientDone { .. } => {
                if let Some(bar) = self.bar.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
                    bar.inc(1);
                }
            }
            Progress::RoundEnd(m) => {
                // A tabular method's model is no classifier; its scores are in results.json.
                let scores = if m.global_accuracy.is_nan() {
                    String::new()
                } else {
                    format!(
                        "global accuracy {:.4}, loss {:.4}, local accuracy {:.4}, ",
                        m.global_accuracy, m.global_loss, m.local_accuracy_mean
                    )
                };
                self.println(&format!(
                    "round {}/{rounds}: {scores}{} clients, {} rejected, {:.1} MB up, {:.1} MB \
                     down, {:.2} s",
                    m.round,
                    m.clients,
                    m.rejected.len(),
                    m.bytes_up as f64 / 1e6,
                    m.bytes_down as f64 / 1e6,
                    m.seconds
                ));
                for r in &m.rejected {
                    self.println(&format!("  rejected client {}: {}", r.client, r.reason));
                }
            }
        }
    }

    fn run_finished(&self) {
        if let Some(bar) = self.bar.lock().unwrap_or_else(|e| e.into_inner()).take() {
            bar.finish_and_clear();
        }
    }

    fn note(&self, line: &str) {
        self.println(line);
    }
}
