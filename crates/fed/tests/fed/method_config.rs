//! The `[method]` table: what each method's settings read and write back (the form recorded
//! in a run's results, fixed here), and errors that name the key of the table.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::sync::Arc;

use fedfuse_core::ModelSpec;
use fedfuse_data::Dataset;
use fedfuse_fed::{BuildContext, FedError, MethodConfig, ServerOptName, ServerStepConfig};

fn parse(json: &str) -> Result<MethodConfig, String> {
    serde_json::from_str(json).map_err(|e| e.to_string())
}

/// What a table reads as, written back: every default spelled out, as results record it.
#[test]
fn settings_write_back_in_the_recorded_form() {
    let sparse_defaults = r#""temperature":0.001,"prune_eps":0.1,"server_lr":0.001,"threshold_server_lr":0.01,"threshold_lr":0.001,"prior_scale":0.0001,"drift":0.0,"initial_theta":0.99"#;
    let grid = "[0.0,0.001,0.003,0.01,0.03,0.1,0.3,1.0,3.0,10.0]";
    let cases = [
        (r#"{"name":"fedavg"}"#, r#"{"name":"fedavg"}"#.to_string()),
        (
            r#"{"name":"fedavg","separate_inits":false}"#,
            r#"{"name":"fedavg"}"#.into(),
        ),
        (
            r#"{"name":"fedavg","separate_inits":true}"#,
            r#"{"name":"fedavg","separate_inits":true}"#.into(),
        ),
        (
            r#"{"name":"fedprox","mu":0.5}"#,
            r#"{"name":"fedprox","mu":0.5}"#.into(),
        ),
        (r#"{"name":"fedmedian"}"#, r#"{"name":"fedmedian"}"#.into()),
        (
            r#"{"name":"fedl1","l1":0.01,"threshold":0.1}"#,
            r#"{"name":"fedl1","l1":0.01,"threshold":0.1}"#.into(),
        ),
        (
            r#"{"name":"fedmix"}"#,
            r#"{"name":"fedmix","components":2,"lambda":1.0,"learn_weights":false}"#.into(),
        ),
        (
            r#"{"name":"fedopt","optimizer":"adam"}"#,
            r#"{"name":"fedopt","optimizer":"adam"}"#.into(),
        ),
        (
            r#"{"momentum":0.9,"name":"fedopt","optimizer":"sgd","server_lr":1.0}"#,
            r#"{"name":"fedopt","optimizer":"sgd","server_lr":1.0,"momentum":0.9}"#.into(),
        ),
        (
            r#"{"name":"feddrop"}"#,
            r#"{"name":"feddrop","fraction":0.25}"#.into(),
        ),
        (
            r#"{"name":"fedsparse"}"#,
            format!(r#"{{"name":"fedsparse","preset":"mid",{sparse_defaults}}}"#),
        ),
        (
            r#"{"lambda0":0.0001,"name":"fedsparse","preset":"high"}"#,
            format!(r#"{{"name":"fedsparse","preset":"high","lambda0":0.0001,{sparse_defaults}}}"#),
        ),
        (
            r#"{"name":"fedtrimmedavg"}"#,
            r#"{"name":"fedtrimmedavg","beta":0.2}"#.into(),
        ),
        (
            r#"{"name":"krum"}"#,
            r#"{"name":"krum","byzantine":0,"keep":1}"#.into(),
        ),
        (
            r#"{"name":"bulyan","byzantine":2}"#,
            r#"{"name":"bulyan","byzantine":2}"#.into(),
        ),
        (
            r#"{"name":"pfnm"}"#,
            r#"{"name":"pfnm","sigma":1.0,"sigma0":1.0,"gamma":1.0,"iters":5}"#.into(),
        ),
        (
            r#"{"gamma":3.0,"iters":2,"name":"pfnm"}"#,
            r#"{"name":"pfnm","sigma":1.0,"sigma0":1.0,"gamma":3.0,"iters":2}"#.into(),
        ),
        // The matching order is written only when it is not the reference's.
        (
            r#"{"name":"pfnm","order":"bottom_up"}"#,
            r#"{"name":"pfnm","sigma":1.0,"sigma0":1.0,"gamma":1.0,"iters":5,"order":"bottom_up"}"#
                .into(),
        ),
        (
            r#"{"name":"pfnm","order":"top_down"}"#,
            r#"{"name":"pfnm","sigma":1.0,"sigma0":1.0,"gamma":1.0,"iters":5}"#.into(),
        ),
        // GPI-FNM records the grid it searches, the default one included.
        (
            r#"{"name":"gpi-fnm"}"#,
            format!(
                r#"{{"name":"gpi-fnm","sigma":1.0,"sigma0":1.0,"gamma":1.0,"iters":5,"eps_grid":{grid}}}"#
            ),
        ),
        (
            r#"{"eps":0.1,"name":"gpi-fnm"}"#,
            format!(
                r#"{{"name":"gpi-fnm","sigma":1.0,"sigma0":1.0,"gamma":1.0,"iters":5,"eps":0.1,"eps_grid":{grid}}}"#
            ),
        ),
        (
            r#"{"eps_grid":[0.0,1.0],"name":"gpi-fnm","sigma":2.0}"#,
            r#"{"name":"gpi-fnm","sigma":2.0,"sigma0":1.0,"gamma":1.0,"iters":5,"eps_grid":[0.0,1.0]}"#
                .into(),
        ),
        (
            r#"{"name":"gems"}"#,
            r#"{"name":"gems","criterion":"loss","neuron_criterion":"loss","neuron_epsilon":0.5,"samples":500,"search":"bisection","r_max":4000.0,"tol":0.01,"neuron_tol":1.0,"step":0.5,"shape":"sphere","fisher_prop":1.0,"clusters":0,"validation_fraction":0.2,"max_retries":3,"output_epochs":10,"finetune_samples":0,"finetune_epochs":5,"finetune_lr":0.01}"#
                .into(),
        ),
    ];
    for (input, written) in cases {
        let config = parse(input).unwrap();
        assert_eq!(serde_json::to_string(&config).unwrap(), written, "{input}");
        // What is written reads back as the same settings.
        assert_eq!(parse(&written).unwrap(), config, "{written}");
    }
}

#[test]
fn unknown_and_missing_keys_are_named() {
    for (input, message) in [
        (
            r#"{"eps":0.1,"name":"pfnm"}"#,
            "unknown field `eps`, expected one of `sigma`, `sigma0`, `gamma`, `iters`, `max_global`, \
             `sigma_grid`, `order`",
        ),
        (
            r#"{"eps_grid":[0.1],"name":"pfnm"}"#,
            "unknown field `eps_grid`, expected one of `sigma`, `sigma0`, `gamma`, `iters`, \
             `max_global`, `sigma_grid`, `order`",
        ),
        (
            r#"{"name":"fedmedian","x":1}"#,
            "unknown field `x`, there are no fields",
        ),
        (r#"{"name":"fedprox"}"#, "missing field `mu`"),
        (
            r#"{"name":"fedsparse","lambda":1}"#,
            "unknown field `lambda`",
        ),
        (r#"{"name":"bogus"}"#, "unknown variant `bogus`"),
    ] {
        let err = parse(input).unwrap_err();
        assert!(err.contains(message), "{input}: {err}");
    }
}

fn build(json: &str) -> Result<Box<dyn fedfuse_fed::Method>, FedError> {
    parse(json).unwrap().build_with(BuildContext {
        spec: Some(ModelSpec::mlp(4, &[3], 2)),
        validation: Some(Arc::new(
            Dataset::new(vec![0.0; 4], vec![0], vec![4], 2).unwrap(),
        )),
        ..BuildContext::default()
    })
}

/// Settings are checked once, when the method is built, and errors name the key in `[method]`
/// whichever crate checks the value.
#[test]
fn build_errors_name_the_method_key() {
    for (input, key) in [
        (r#"{"name":"fedprox","mu":-1}"#, "mu"),
        (r#"{"name":"fedl1","l1":-1,"threshold":0.1}"#, "l1"),
        (r#"{"name":"fedmix","lambda":-1}"#, "lambda"),
        (r#"{"name":"fedmix","components":0}"#, "components"),
        (r#"{"name":"feddrop","fraction":1}"#, "fraction"),
        (r#"{"name":"fedtrimmedavg","beta":0.7}"#, "beta"),
        (r#"{"name":"krum","keep":0}"#, "keep"),
        (r#"{"name":"fedsparse","lambda0":-1}"#, "lambda0"),
        (r#"{"name":"fedsparse","temperature":0}"#, "temperature"),
        (r#"{"name":"fedsparse","prune_eps":2}"#, "prune_eps"),
        (r#"{"name":"fedsparse","server_lr":-1}"#, "server_lr"),
        (
            r#"{"name":"fedsparse","threshold_server_lr":0}"#,
            "threshold_server_lr",
        ),
        (r#"{"name":"pfnm","sigma0":-1}"#, "sigma0"),
        (r#"{"name":"gpi-fnm","eps":-0.1}"#, "eps"),
        (r#"{"name":"gpi-fnm","eps_grid":[]}"#, "eps_grid"),
        (r#"{"name":"pfnm","sigma_grid":[]}"#, "sigma_grid"),
        (r#"{"name":"pfnm","sigma_grid":[0.1,-1]}"#, "sigma_grid"),
        (r#"{"name":"gpi-fnm","sigma_grid":[0]}"#, "sigma_grid"),
        (r#"{"name":"gems","r_max":-1}"#, "r_max"),
        (r#"{"name":"gems","neuron_tol":0}"#, "neuron_tol"),
        (r#"{"name":"gems","fisher_prop":2}"#, "fisher_prop"),
        (
            r#"{"name":"fedopt","optimizer":"adam","momentum":0.9}"#,
            "momentum",
        ),
        (
            r#"{"name":"fedopt","optimizer":"adam","server_lr":-1}"#,
            "server_lr",
        ),
        (r#"{"name":"fedopt","optimizer":"adamax","tau":-1}"#, "tau"),
    ] {
        let err = build(input).err().expect(input);
        assert!(
            matches!(&err, FedError::MethodSetting { field, .. } if *field == key),
            "{input}: {err:?}"
        );
        assert!(
            err.to_string().contains(&format!("`method.{key}`")),
            "{err}"
        );
    }
}

#[test]
fn server_table_errors_name_server_keys() {
    let step = |optimizer, tau, momentum| ServerStepConfig {
        optimizer,
        lr: None,
        beta1: None,
        beta2: None,
        tau,
        momentum,
    };
    for (config, key) in [
        (
            step(ServerOptName::Adam, None, Some(0.9)),
            "server.momentum",
        ),
        (
            step(ServerOptName::KingmaAdam, Some(-1.0), None),
            "server.tau",
        ),
    ] {
        let err = config.optimizer().unwrap_err();
        assert!(
            matches!(&err, FedError::InvalidSetting { field, .. } if *field == key),
            "{err:?}"
        );
    }
    step(ServerOptName::Adam, Some(1e-3), None)
        .optimizer()
        .unwrap();
}

#[test]
fn programmatic_settings_are_checked_as_files_are() {
    use fedfuse_fed::PfnmSettings;
    // A PFNM given GPI-FNM's keys in code is refused, as a file would be.
    let pfnm = MethodConfig::Pfnm(PfnmSettings {
        eps: Some(0.1),
        ..PfnmSettings::default()
    });
    let ctx = BuildContext {
        spec: Some(ModelSpec::mlp(4, &[3], 2)),
        ..BuildContext::default()
    };
    let err = pfnm.build_with(ctx.clone()).err().unwrap();
    assert!(
        matches!(err, FedError::MethodSetting { field: "eps", .. }),
        "{err}"
    );
    // GPI-FNM without a grid in code searches the default grid, which needs validation data.
    let gpi = MethodConfig::GpiFnm(PfnmSettings::default());
    assert!(gpi.needs_validation());
    let err = gpi.build_with(ctx).err().unwrap();
    assert!(
        matches!(
            err,
            FedError::MethodSetting {
                field: "eps_grid",
                ..
            }
        ),
        "{err}"
    );
}
