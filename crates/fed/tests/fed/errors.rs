//! Errors that keep their cause and name what the user can act on: one test per variant of
//! [`FedError`] that is not a setting (those are in `method_config.rs`).

use std::error::Error as _;

use fedfuse_core::{ModelSpec, Params, Record};
use fedfuse_fed::{
    Aggregate, BuildContext, FedError, GemsSettings, Method, MethodConfig, Population, Reply,
    Session, SimConfig, simulate_session,
};

/// The message and every source below it, `: `-separated (what `{:#}` prints in the binary).
fn chain(e: &FedError) -> String {
    let mut text = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        text += &format!(": {s}");
        next = s.source();
    }
    text
}

#[test]
fn a_failed_checkpoint_names_its_round_and_keeps_the_cause() {
    let data = crate::common::digits(4, &fedfuse_data::PartitionSpec::Iid {}, 0);
    let trainer = fedfuse_train::Trainer::new(ModelSpec::mlp(64, &[], 10)).unwrap();
    let init = fedfuse_train::init_params(trainer.spec(), Default::default(), 0);
    let full = |_: &Params, rounds: &[fedfuse_fed::RoundMetrics], _: &dyn Method| {
        if rounds.len() < 2 {
            Ok(())
        } else {
            Err(std::io::Error::other("No space left on device").into())
        }
    };
    let session = Session {
        after_round: Some(&full),
        ..Session::default()
    };
    let err = simulate_session(
        &mut fedfuse_fed::FedAvg,
        Population::labelled(&trainer, &data.clients, &data.test),
        init,
        &SimConfig {
            rounds: 3,
            ..SimConfig::default()
        },
        &|_| {},
        session,
    )
    .unwrap_err();
    assert!(
        matches!(err, FedError::Checkpoint { round: 2, .. }),
        "{err:?}"
    );
    assert_eq!(
        chain(&err),
        "checkpoint after round 2: No space left on device"
    );
}

#[test]
fn a_server_state_used_out_of_order_says_so() {
    let spec = ModelSpec::mlp(4, &[3], 2);
    let mut sparse = MethodConfig::FedSparse(Default::default())
        .build_with(BuildContext {
            spec: Some(spec.clone()),
            ..BuildContext::default()
        })
        .unwrap();
    let global = fedfuse_train::init_params(&spec, Default::default(), 0);
    // No instruction began round 1, so there is no round to finish.
    let err = sparse.aggregate(1, &global, &[]).err().unwrap();
    assert!(
        matches!(
            err,
            FedError::MethodState {
                method: "fedsparse",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("never began"), "{err}");
}

#[test]
fn a_state_that_cannot_be_encoded_keeps_the_encoders_error() {
    let source = serde_json::from_str::<u8>("[]").unwrap_err();
    let expected = format!("cannot save PFNM's matching: {source}");
    let err = FedError::SaveState {
        what: "PFNM's matching",
        source,
    };
    assert_eq!(chain(&err), expected);
}

/// A method with server state it cannot save.
struct Forgetful;

impl Method for Forgetful {
    fn name(&self) -> &'static str {
        "forgetful"
    }
    fn aggregate(&mut self, _: usize, _: &Params, _: &[Reply]) -> fedfuse_fed::Result<Aggregate> {
        Ok(Aggregate::Keep)
    }
}

#[test]
fn a_method_that_cannot_resume_says_what_to_do() {
    let err = Forgetful.load_state(Record::default()).unwrap_err();
    assert!(
        matches!(
            err,
            FedError::CannotResume {
                method: "forgetful"
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("without --resume"), "{err}");
}

#[test]
fn a_reply_that_fails_a_methods_checks_names_the_method_and_the_problem() {
    let gems = MethodConfig::Gems(GemsSettings::default())
        .build_with(BuildContext {
            spec: Some(ModelSpec::mlp(4, &[3], 2)),
            ..BuildContext::default()
        })
        .unwrap();
    let err = gems
        .check_reply(&Params::new(), &Record::default())
        .unwrap_err();
    assert!(
        matches!(err, FedError::InvalidReply { method: "gems", .. }),
        "{err:?}"
    );
    assert!(err.to_string().starts_with("gems reply: "), "{err}");
    assert!(err.to_string().contains("`centres` and `radii`"), "{err}");
}

/// FedMA's assignment tensor comes from the server: on a client, a value that is no unit index
/// (not a number, negative, fractional, beyond f32's exact integers) or a missing assignment
/// is refused naming the client, never a panic or a huge allocation.
#[test]
fn a_hostile_fedma_assignment_is_refused() {
    use fedfuse_core::{ConfigValue, LayerSpec};
    use fedfuse_data::{ClientData, Dataset};
    use fedfuse_fed::{BuildContext, ClientContext, FedMaSettings, Method};
    use fedfuse_train::{Init, TrainConfig, Trainer};

    let spec = ModelSpec::sequential(
        &[3],
        vec![
            LayerSpec::linear(4),
            LayerSpec::Relu,
            LayerSpec::linear(3),
            LayerSpec::Relu,
            LayerSpec::linear(2),
        ],
    );
    let ctx = BuildContext {
        init: Init::Default,
        seed: 0,
        spec: Some(spec.clone()),
        validation: None,
    };
    let fedma = FedMaSettings::default().build(&ctx).unwrap();
    let trainer = Trainer::new(spec).unwrap();
    let data = Dataset::new(vec![0.5; 12], vec![0, 1, 0, 1], vec![3], 2).unwrap();
    let client = ClientData {
        train: data.clone(),
        test: data,
    };
    let train = TrainConfig::default();
    let cctx = ClientContext {
        id: 7,
        data: &client,
        trainer: &trainer,
        train: &train,
        seed: 1,
    };
    let instruction = |assign: Option<Vec<f32>>| {
        let mut r = Record::default().with_config("fedma_stage", ConfigValue::Int(1));
        if let Some(a) = assign {
            r.params.push("fedma_assign", vec![a.len()], a).unwrap();
        }
        r
    };
    for bad in [
        vec![f32::NAN],
        vec![-1.0],
        vec![0.5],
        vec![3.3e7],
        vec![f32::INFINITY],
    ] {
        let e = fedma
            .fit(instruction(Some(bad.clone())), &cctx)
            .unwrap_err();
        assert!(
            e.to_string().contains("client 7") && e.to_string().contains("no unit index"),
            "{bad:?}: {e}"
        );
    }
    let e = fedma.fit(instruction(None), &cctx).unwrap_err();
    assert!(e.to_string().contains("was not matched"), "{e}");
}
