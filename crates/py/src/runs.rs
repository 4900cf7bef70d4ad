//! `fedfuse.run`: a federation run from Python, as `fedfuse run` runs it, with its progress
//! handed to a Python callback and Ctrl-C stopping it after the round in progress.

use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::time::Duration;

use fedfuse_fed::Progress;
use fedfuse_lab::{Config, Observer};
use pyo3::prelude::*;

use crate::convert::*;

/// What the federation's thread tells the calling one.
enum Event {
    Started {
        rounds: usize,
    },
    RoundStart {
        round: usize,
        clients: usize,
    },
    ClientDone {
        round: usize,
    },
    /// The run waits for `ack` before its after-round step, which reads the stop flag: so a
    /// Ctrl-C seen by then stops the run after this round, however far behind the calling
    /// thread was.
    RoundEnd {
        round: usize,
        accuracy: f64,
        ack: mpsc::SyncSender<()>,
    },
    Note(String),
}

/// Hands every event to the calling thread (which alone may run Python code that sees
/// Ctrl-C).
struct Forward(Mutex<Sender<Event>>);

impl Forward {
    fn send(&self, e: Event) {
        // A closed channel means the caller has gone; the run goes on to its end unseen.
        if let Ok(tx) = self.0.lock() {
            let _ = tx.send(e);
        }
    }
}

impl Observer for Forward {
    fn run_started(&self, rounds: usize) {
        self.send(Event::Started { rounds });
    }

    fn progress(&self, p: Progress<'_>) {
        match p {
            Progress::RoundStart { round, clients } => {
                self.send(Event::RoundStart { round, clients })
            }
            Progress::ClientDone { round } => self.send(Event::ClientDone { round }),
            Progress::RoundEnd(m) => {
                let (ack, done) = mpsc::sync_channel(1);
                self.send(Event::RoundEnd {
                    round: m.round,
                    accuracy: m.global_accuracy,
                    ack,
                });
                // An error: the calling thread has gone, and nobody is left to wait for.
                let _ = done.recv();
            }
        }
    }

    fn note(&self, line: &str) {
        self.send(Event::Note(line.to_string()));
    }
}

/// Runs the federation of the config file `config` with `--set`-style `overrides`, as
/// `fedfuse run` does (the same checks, the same bits), writing the run folder `out` when
/// given (with a checkpoint beside it after each round; `resume` continues from it), and
/// TensorBoard event files into `tensorboard` when given.
/// `progress(kind, a, b)` is called on the calling thread: `("start", rounds, 0)`,
/// `("round", round, clients)`, `("client", round, 0)`, `("end", round, accuracy)`,
/// `("note", 0, 0)` with the line as a fourth argument. Ctrl-C (or an exception raised by
/// `progress`) stops the run after the round in progress and is raised again then.
///
/// Returns what results.json holds (`config`, `rounds`, `final`) and the final model as the
/// run saves it.
#[pyfunction]
#[pyo3(signature = (config, overrides, data_dir, out, resume, progress, tensorboard))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn run<'py>(
    py: Python<'py>,
    config: PathBuf,
    overrides: Vec<String>,
    data_dir: Option<PathBuf>,
    out: Option<PathBuf>,
    resume: bool,
    progress: Option<Bound<'py, PyAny>>,
    tensorboard: Option<PathBuf>,
) -> PyResult<(Bound<'py, PyAny>, PyTensors<'py>)> {
    let mut cfg = Config::load(&config, &overrides).map_err(err)?;
    if data_dir.is_some() {
        cfg.data_dir = data_dir;
    }
    if tensorboard.is_some() {
        cfg.logging.tensorboard = tensorboard;
    }
    if resume && out.is_none() {
        return Err(err("resume=True continues the run in `out`; give out"));
    }
    let result = watched(py, progress.as_ref(), |forward, stop| {
        match out.as_deref() {
            Some(out) => fedfuse_lab::run::run_until(&cfg, out, forward, resume, Some(stop)),
            None => fedfuse_lab::run::federate_until(&cfg, forward, stop),
        }
        .map_err(|e| format!("{e:#}"))
    })?;
    let results = to_py(py, &fedfuse_lab::output::results(&cfg, &result))?;
    let model = fedfuse_lab::run::saved_model(&cfg, &result).map_err(err)?;
    Ok((results, params_to_py(py, &model)))
}

/// Runs `work` on a thread of its own while this one hands its events to `progress` and
/// watches for Ctrl-C: Python runs signal handlers only on its main thread, between bytecodes,
/// so this thread waits with the GIL released (100 ms at a time) and calls `check_signals`
/// after each wait. A `KeyboardInterrupt` there (or an exception from `progress`) sets the
/// stop flag `work` reads after each round, and is raised once `work` has returned.
fn watched<T: Send>(
    py: Python<'_>,
    progress: Option<&Bound<'_, PyAny>>,
    work: impl FnOnce(&Forward, &AtomicBool) -> Result<T, String> + Send,
) -> PyResult<T> {
    let stop = AtomicBool::new(false);
    let (tx, rx) = mpsc::channel();
    // `detach` hands its closure to no other thread, but asks for `Send` all the same.
    let rx = Mutex::new(rx);
    let mut raised: Option<PyErr> = None;
    let outcome = std::thread::scope(|s| {
        let stop = &stop;
        let worker = s.spawn(move || {
            let forward = Forward(Mutex::new(tx));
            work(&forward, stop)
        });
        loop {
            let next = py.detach(|| match rx.lock() {
                Ok(rx) => rx.recv_timeout(Duration::from_millis(100)),
                Err(_) => Err(RecvTimeoutError::Disconnected),
            });
            let (delivered, ack) = match next {
                Ok(event) => {
                    let ack = match &event {
                        Event::RoundEnd { ack, .. } => Some(ack.clone()),
                        _ => None,
                    };
                    (progress.map_or(Ok(()), |cb| deliver(cb, event)), ack)
                }
                Err(RecvTimeoutError::Timeout) => (Ok(()), None),
                Err(RecvTimeoutError::Disconnected) => break,
            };
            let checked = delivered.and_then(|()| py.check_signals());
            if let (Err(e), None) = (checked, &raised) {
                stop.store(true, Ordering::Relaxed);
                raised = Some(e);
            }
            if let Some(ack) = ack {
                let _ = ack.send(());
            }
        }
        // A signal that came in after the last event still counts.
        if let (Err(e), None) = (py.check_signals(), &raised) {
            raised = Some(e);
        }
        worker
            .join()
            .unwrap_or_else(|_| Err("the run's thread panicked".into()))
    });
    if let Some(e) = raised {
        return Err(e);
    }
    outcome.map_err(err)
}

/// Runs the `fedfuse compare` file `config` into `out` (as the command does: every arm for
/// every seed, results.csv, summary.csv, summary.md, plots, runs.toml), with `seeds` replacing
/// the file's when given; `progress`, Ctrl-C and `resume` as for [`run`] (an interrupted
/// comparison keeps the runs it finished, which `resume` takes from `out`).
#[pyfunction]
#[pyo3(signature = (config, out, data_dir, seeds, resume, progress, tensorboard))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn compare(
    py: Python<'_>,
    config: PathBuf,
    out: PathBuf,
    data_dir: Option<PathBuf>,
    seeds: Option<Vec<u64>>,
    resume: bool,
    progress: Option<Bound<'_, PyAny>>,
    tensorboard: Option<PathBuf>,
) -> PyResult<()> {
    let mut cfg = fedfuse_lab::compare::CompareConfig::load(&config).map_err(err)?;
    replace_seeds(&mut cfg.seeds, seeds)?;
    watched(py, progress.as_ref(), |forward, stop| {
        fedfuse_lab::compare::run(
            &cfg,
            &out,
            data_dir.as_deref(),
            forward,
            resume,
            tensorboard.as_deref(),
            Some(stop),
        )
        .map_err(|e| format!("{e:#}"))
    })
}

/// Runs the `fedfuse sweep` file `config` into `out` as the command does, with `seeds`
/// replacing the file's when given; `progress` gets its notes; Ctrl-C ends it before its
/// next setting (the finished ones stay in `out` for `resume`).
#[pyfunction]
#[pyo3(signature = (config, out, data_dir, seeds, resume, progress, tensorboard))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn sweep(
    py: Python<'_>,
    config: PathBuf,
    out: PathBuf,
    data_dir: Option<PathBuf>,
    seeds: Option<Vec<u64>>,
    resume: bool,
    progress: Option<Bound<'_, PyAny>>,
    tensorboard: Option<PathBuf>,
) -> PyResult<()> {
    let mut cfg = fedfuse_lab::sweep::SweepConfig::load(&config).map_err(err)?;
    replace_seeds(&mut cfg.seeds, seeds)?;
    watched(py, progress.as_ref(), |forward, stop| {
        fedfuse_lab::sweep::run(
            &cfg,
            &out,
            data_dir.as_deref(),
            forward,
            resume,
            Some(stop),
            tensorboard.as_deref(),
        )
        .map_err(|e| format!("{e:#}"))
    })
}

/// `seeds`, when given, replaces an experiment file's.
fn replace_seeds(seeds: &mut Vec<u64>, given: Option<Vec<u64>>) -> PyResult<()> {
    match given {
        Some(given) if given.is_empty() => Err(err("seeds needs at least one seed")),
        Some(given) => {
            *seeds = given;
            Ok(())
        }
        None => Ok(()),
    }
}

/// Calls the Python progress callback with one event.
fn deliver(cb: &Bound<'_, PyAny>, event: Event) -> PyResult<()> {
    match event {
        Event::Started { rounds } => cb.call1(("start", rounds, 0)),
        Event::RoundStart { round, clients } => cb.call1(("round", round, clients)),
        Event::ClientDone { round } => cb.call1(("client", round, 0)),
        Event::RoundEnd {
            round, accuracy, ..
        } => cb.call1(("end", round, accuracy)),
        Event::Note(line) => cb.call1(("note", 0, 0, line)),
    }
    .map(drop)
}

/// `(loss, accuracy, samples)` of the model `tensors` on the set a run of the config file
/// `config` (with `overrides` and `data_dir`, as for [`run`]) scores its global model on:
/// the test set, or the validation split with `dataset.score = "validation"`. Tensors go by
/// name, the run's file names (torchvision's for its ResNets) or the layer list's.
///
/// Instead of a config file, `model` (a `[model]` table as JSON) and `dataset` (its name) make
/// one: a run of that model on that dataset, its other settings the defaults.
#[pyfunction]
#[pyo3(signature = (config, model, dataset, overrides, data_dir, tensors))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn evaluate(
    py: Python<'_>,
    config: Option<PathBuf>,
    model: Option<String>,
    dataset: Option<String>,
    overrides: Vec<String>,
    data_dir: Option<PathBuf>,
    tensors: PyTensors<'_>,
) -> PyResult<(f64, f64, usize)> {
    let mut cfg = match (config, model, dataset) {
        (Some(path), None, None) => Config::load(&path, &overrides).map_err(err)?,
        (None, Some(model), Some(dataset)) => {
            let model: toml::Value =
                serde_json::from_str(&model).map_err(|e| err(format!("the model section: {e}")))?;
            let mut table = toml::Table::new();
            table.insert("rounds".into(), 1.into());
            table.insert("clients".into(), 1.into());
            let section = |k: &str, v: toml::Value| {
                let mut t = toml::Table::new();
                t.insert(k.into(), v);
                toml::Value::Table(t)
            };
            table.insert("dataset".into(), section("name", dataset.into()));
            table.insert("method".into(), section("name", "fedavg".into()));
            table.insert("model".into(), model);
            let text = toml::to_string(&table).map_err(err)?;
            Config::parse(&text, &overrides).map_err(err)?
        }
        _ => return Err(err("give a config file, or a model section and a dataset")),
    };
    if data_dir.is_some() {
        cfg.data_dir = data_dir;
    }
    let params = params_from_py(tensors, 0)?;
    py.detach(|| {
        let fed = fedfuse_lab::run::Federation::prepare(&cfg).map_err(|e| format!("{e:#}"))?;
        let names = cfg.model.as_ref().and_then(|m| m.torchvision_names());
        fed.score(params, names.as_ref())
            .map_err(|e| format!("{e:#}"))
    })
    .map_err(err)
}
