use fedfuse_data::{digits, known_datasets, load_dataset};

#[test]
fn bundled_digits() {
    let all = digits().unwrap();
    assert_eq!(all.len(), 1797);
    assert_eq!(all.num_classes, 10);
    assert_eq!(all.sample_shape, vec![64]);
    assert!(all.x.iter().all(|&v| (0.0..=1.0).contains(&v)));
    assert_eq!(all.x.iter().cloned().fold(0.0f32, f32::max), 1.0);
    // sklearn load_digits: np.bincount(y) = [178 182 177 183 181 182 181 179 174 180]
    assert_eq!(
        all.class_counts(),
        vec![178, 182, 177, 183, 181, 182, 181, 179, 174, 180]
    );

    let a = load_dataset("digits", None).unwrap();
    let b = load_dataset("digits", None).unwrap();
    assert_eq!(a, b, "the split is deterministic");
    assert_eq!((a.train.len(), a.test.len()), (1438, 359));
    assert_eq!(a.train.sample_shape, vec![64]);
    // the split is a shuffle, not the file order
    assert_ne!(&a.train.y[..20], &all.y[..20]);
    let mut counts = a.train.class_counts();
    counts
        .iter_mut()
        .zip(a.test.class_counts())
        .for_each(|(c, t)| *c += t);
    assert_eq!(counts, all.class_counts());
    assert!(
        known_datasets()
            .iter()
            .any(|d| d.name == "digits" && d.citation.contains("Alpaydin"))
    );
}
