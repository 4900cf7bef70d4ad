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
