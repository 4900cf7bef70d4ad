use prost::Message as _;

use crate::flwr::proto::{
    Array, ArrayRecord, BoolList, ConfigRecord, ConfigRecordValue, DoubleList, Message, Metadata,
    MetricRecord, MetricRecordValue, RecordDict, array_record, config_record, config_record_value,
    metric_record, metric_record_value, record_dict,
};

/// A train reply: arrays, metrics and config, with values from each family of oneof member.
fn train_reply() -> Message {
    let array = Array {
        dtype: "float32".into(),
        shape: vec![2, 3],
        stype: "numpy.ndarray".into(),
        data: (0u8..8).collect(),
    };
    let metric = |key: &str, value| metric_record::Item {
        key: key.into(),
        value: Some(MetricRecordValue { value: Some(value) }),
    };
    let config = |key: &str, value| config_record::Item {
        key: key.into(),
        value: Some(ConfigRecordValue { value: Some(value) }),
    };
    let record = |key: &str, value| record_dict::Item {
        key: key.into(),
        value: Some(value),
    };
    Message {
        metadata: Some(Metadata {
            run_id: 42,
            src_node_id: 1,
            dst_node_id: 7,
            group_id: "3".into(),
            ttl: 43200.0,
            message_type: "train".into(),
            created_at: 1.5e9,
            // proto3 `optional`: present even though it is the default value.
            src_task_id: Some(0),
            ..Metadata::default()
        }),
        content: Some(RecordDict {
            items: vec![
                record(
                    "arrays",
                    record_dict::item::Value::ArrayRecord(ArrayRecord {
                        items: vec![array_record::Item {
                            key: "w".into(),
                            value: Some(array),
                        }],
                    }),
                ),
                record(
                    "metrics",
                    record_dict::item::Value::MetricRecord(MetricRecord {
                        items: vec![
                            metric("num-examples", metric_record_value::Value::Uint64(60)),
                            metric(
                                "loss",
                                metric_record_value::Value::DoubleList(DoubleList {
                                    vals: vec![0.5, -1.0],
                                }),
                            ),
                        ],
                    }),
                ),
                record(
                    "config",
                    record_dict::item::Value::ConfigRecord(ConfigRecord {
                        items: vec![
                            config("server-round", config_record_value::Value::Sint64(-3)),
                            config("note", config_record_value::Value::String("x".into())),
                            config(
                                "flags",
                                config_record_value::Value::BoolList(BoolList {
                                    vals: vec![true, false],
                                }),
                            ),
                        ],
                    }),
                ),
            ],
        }),
        error: None,
    }
}

/// The same message as flwr 1.41.0 serialises it (`SerializeToString(deterministic=True)` on
/// `flwr.proto.message_pb2.Message`, built field for field like `train_reply`).
const FLWR_BYTES: &str = "0a24082a1801200732013339000000000018e5404205747261696e49000000c00b5ad6\
    41500012b8010a370a06617272617973122d0a2b0a017712260a07666c6f61743332120202031a0d6e756d70\
    792e6e646172726179220800010203040506070a3e0a076d6574726963731a330a120a0c6e756d2d6578616d\
    706c65731202183c0a1d0a046c6f73731215aa01120a10000000000000e03f000000000000f0bf0a3d0a0663\
    6f6e66696722330a120a0c7365727665722d726f756e64120210050a0b0a046e6f746512032a01780a100a05\
    666c6167731207c201040a020100";

fn from_hex(hex: &str) -> Vec<u8> {
    let digits: Vec<u8> = hex.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    digits
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap())
        .collect()
}

#[test]
fn message_with_a_recorddict_round_trips() {
    let message = train_reply();
    let bytes = message.encode_to_vec();
    assert_eq!(bytes.len(), message.encoded_len());
    let decoded = Message::decode(bytes.as_slice()).unwrap();
    assert_eq!(decoded, message);
    let metadata = decoded.metadata.as_ref().unwrap();
    assert_eq!(
        (metadata.src_task_id, metadata.dst_task_id),
        (Some(0), None)
    );
}

#[test]
fn encoding_matches_flwr_byte_for_byte() {
    let flwr = from_hex(FLWR_BYTES);
    assert_eq!(train_reply().encode_to_vec(), flwr);
    assert_eq!(Message::decode(flwr.as_slice()).unwrap(), train_reply());
}
