use fedfuse_data::{ColumnRef, CsvOptions, DataError, LabelColumn, read_csv, read_csv_table};

use crate::common::shared;

#[test]
fn iris() {
    // iris.csv's first line is "150,4,setosa,versicolor,virginica": read it as the header.
    let ds = read_csv(&shared().join("uci-small/iris.csv"), &CsvOptions::default()).unwrap();
    assert_eq!(ds.len(), 150);
    assert_eq!(ds.sample_shape, vec![4]);
    assert_eq!(ds.num_classes, 3);
    assert_eq!(ds.class_counts(), vec![50, 50, 50]);
    assert_eq!(ds.sample(0), &[5.1, 3.5, 1.4, 0.2]);
}

#[test]
fn categorical_and_string_labels() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("pets.csv");
    std::fs::write(
        &p,
        "weight,colour,\"kind\",age\r\n4.5,red,cat,3\r\n30, blue ,dog,5\r\n\r\n5,red,\"cat\",1\r\n12,green,dog,7\r\n",
    )
    .unwrap();
    let opts = CsvOptions {
        has_header: true,
        label_column: LabelColumn::Name("kind".into()),
        categorical: vec![ColumnRef::Name("colour".into())],
        delimiter: b',',
    };
    let t = read_csv_table(&p, &opts).unwrap();
    assert_eq!(
        t.feature_names,
        vec!["weight", "colour=blue", "colour=green", "colour=red", "age"]
    );
    assert_eq!(t.class_names, vec!["cat", "dog"]);
    assert_eq!(t.dataset.y, vec![0, 1, 0, 1]);
    assert_eq!(t.dataset.sample(1), &[30., 1., 0., 0., 5.]);
    assert_eq!(t.dataset.sample(3), &[12., 0., 1., 0., 7.]);
    // by index, no header, semicolons
    let p2 = dir.path().join("semi.csv");
    std::fs::write(&p2, "b;1.5;x\na;2.5;y\n").unwrap();
    let t = read_csv_table(
        &p2,
        &CsvOptions {
            has_header: false,
            label_column: LabelColumn::Index(0),
            categorical: vec![2.into()],
            delimiter: b';',
        },
    )
    .unwrap();
    assert_eq!(t.dataset.y, vec![1, 0]);
    assert_eq!(t.dataset.x, vec![1.5, 1., 0., 2.5, 0., 1.]);
}

#[test]
fn bad_values_name_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.csv");
    std::fs::write(&p, "a,b,label\n1,2,x\n3,oops,y\n").unwrap();
    let e = read_csv(&p, &CsvOptions::default()).unwrap_err();
    assert!(matches!(e, DataError::Csv { line: 3, .. }), "{e:?}");
    let msg = e.to_string();
    assert!(
        msg.contains("bad.csv")
            && msg.contains("line 3")
            && msg.contains("column 2")
            && msg.contains("\"b\""),
        "{msg}"
    );
    assert!(msg.contains("oops"), "{msg}");

    std::fs::write(&p, "a,b,label\n1,,x\n").unwrap();
    let msg = read_csv(&p, &CsvOptions::default())
        .unwrap_err()
        .to_string();
    assert!(msg.contains("line 2") && msg.contains("missing"), "{msg}");

    std::fs::write(&p, "a,b,label\n1,2,x\n1,2\n").unwrap();
    let msg = read_csv(&p, &CsvOptions::default())
        .unwrap_err()
        .to_string();
    assert!(msg.contains("line 3") && msg.contains("2 fields"), "{msg}");

    std::fs::write(&p, "a,b,label\n1,2,x\n").unwrap();
    let opts = CsvOptions {
        label_column: LabelColumn::Name("nope".into()),
        ..CsvOptions::default()
    };
    let msg = read_csv(&p, &opts).unwrap_err().to_string();
    assert!(msg.contains("nope") && msg.contains("bad.csv"), "{msg}");
}
