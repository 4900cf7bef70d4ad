//! Tests of the FedNGM data side: mixed-type tables and their shared encoding, the CDC infant
//! death loader on the real file, and the synthetic Gaussian graphical models.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::io::Write;
use std::path::{Path, PathBuf};

use fedfuse_data::{
    BlockKind, CDC_2015_ZIP, CDC_FEATURES, CdcExtra, CdcOptions, CdcSplit, Coding, Column,
    ColumnStats, DataError, Encoding, GgmConfig, GraphShape, Table, cholesky, conditional_mean,
    load_cdc, sample_ggm,
};
use rand::SeedableRng;
use rand::rngs::StdRng;

fn table(cols: Vec<(&str, Column)>) -> Table {
    Table::new(cols.into_iter().map(|(n, c)| (n.to_string(), c)).collect()).unwrap()
}

mod encoding {
    use super::*;

    fn client_a() -> Table {
        table(vec![
            ("age", Column::Real(vec![20.0, 35.0, 27.5])),
            ("sex", Column::categorical(&["m", "f", "m"])),
            ("race", Column::categorical(&["b", "a", "a"])),
        ])
    }

    fn client_b() -> Table {
        table(vec![
            ("race", Column::categorical(&["c", "a"])),
            ("age", Column::Real(vec![15.0, 30.0])),
            ("sex", Column::categorical(&["f", "f"])),
            ("smoker", Column::categorical(&["yes", "no"])),
        ])
    }

    #[test]
    fn merging_client_stats_gives_global_range_and_union_vocabulary() {
        let enc = Encoding::merge(&[client_a().stats(), client_b().stats()]).unwrap();
        // Canonical order: by name, whatever the clients' column order.
        assert_eq!(enc.names(), vec!["age", "race", "sex", "smoker"]);
        assert_eq!(
            enc.feature("age").unwrap().coding,
            Coding::Real {
                min: 15.0,
                max: 35.0
            }
        );
        let levels = |n: &str| match &enc.feature(n).unwrap().coding {
            Coding::Categorical { levels } => levels.clone(),
            Coding::Real { .. } => panic!("{n} should be categorical"),
        };
        assert_eq!(levels("race"), vec!["a", "b", "c"]);
        assert_eq!(levels("sex"), vec!["f", "m"]);
        // Client order does not matter.
        let swapped = Encoding::merge(&[client_b().stats(), client_a().stats()]).unwrap();
        assert_eq!(swapped, enc);
        // Only levels that occur are reported.
        let t = client_a().select_rows(&[1, 2]).unwrap();
        assert_eq!(
            t.stats().columns["race"],
            ColumnStats::Categorical {
                levels: vec!["a".into()]
            }
        );
    }

    #[test]
    fn encode_decode_round_trip() {
        let enc = Encoding::merge(&[client_a().stats(), client_b().stats()]).unwrap();
        let sub = enc.subset(&["age", "race", "sex"]).unwrap();
        let e = sub.encode(&client_a()).unwrap();
        assert_eq!(e.n, 3);
        assert_eq!(e.width(), 1 + 3 + 2);
        let kinds: Vec<_> = e.blocks.iter().map(|b| (b.start, b.len, b.kind)).collect();
        assert_eq!(
            kinds,
            vec![
                (0, 1, BlockKind::Real),
                (1, 3, BlockKind::Categorical),
                (4, 2, BlockKind::Categorical)
            ]
        );
        // Row 0: age 20 -> (20-15)/20 = 0.25; race b; sex m.
        assert_eq!(&e.x[..6], &[0.25, 0.0, 1.0, 0.0, 0.0, 1.0]);
        let back = sub.decode(&e.x, e.n).unwrap();
        let orig = client_a();
        match (back.column("age").unwrap(), orig.column("age").unwrap()) {
            (Column::Real(a), Column::Real(b)) => {
                for (x, y) in a.iter().zip(b) {
                    assert!((x - y).abs() < 1e-5, "{x} vs {y}");
                }
            }
            _ => panic!("age should be real"),
        }
        for c in ["race", "sex"] {
            for r in 0..3 {
                assert_eq!(
                    back.column(c).unwrap().level(r),
                    orig.column(c).unwrap().level(r)
                );
            }
        }
        // Soft outputs decode by argmax.
        let mut soft = e.x.clone();
        soft[1..4].copy_from_slice(&[0.1, 0.3, 0.2]);
        let d = sub.decode(&soft, 3).unwrap();
        assert_eq!(d.column("race").unwrap().level(0), Some("b"));
    }

    #[test]
    fn subset_orders_consensus_then_extras() {
        let enc = Encoding::merge(&[client_a().stats(), client_b().stats()]).unwrap();
        let stitched = enc.subset(&["sex", "age", "smoker"]).unwrap();
        let blocks = stitched.blocks();
        assert_eq!(blocks[2].name, "smoker");
        assert_eq!((blocks[2].start, blocks[2].len), (3, 2));
        let e = stitched.encode(&client_b()).unwrap();
        assert_eq!(e.x.len(), 2 * 5);
        // Client A has no smoker column.
        assert!(matches!(
            stitched.encode(&client_a()),
            Err(DataError::MissingColumn { ref column, .. }) if column == "smoker"
        ));
    }

    #[test]
    fn unseen_level_is_a_clear_error() {
        let enc = Encoding::merge(&[client_a().stats()]).unwrap();
        let err = enc.encode(&client_b()).unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(&err, DataError::UnknownLevel { column, level, .. } if column == "race" && level == "c"),
            "{msg}"
        );
        assert!(msg.contains("rebuild"), "{msg}");
    }

    #[test]
    fn type_conflicts_and_bad_tables_are_errors() {
        let real = table(vec![("x", Column::Real(vec![1.0]))]);
        let cat = table(vec![("x", Column::categorical(&["a"]))]);
        assert!(matches!(
            Encoding::merge(&[real.stats(), cat.stats()]),
            Err(DataError::Encoding(_))
        ));
        assert!(
            Table::new(vec![
                ("x".into(), Column::Real(vec![1.0, 2.0])),
                ("y".into(), Column::Real(vec![1.0])),
            ])
            .is_err()
        );
        assert!(Table::new(vec![("x".into(), Column::Real(vec![f32::NAN]))]).is_err());
    }

    #[test]
    fn group_by_splits_rows_and_concat_pools_them() {
        let t = client_a().with_column("site", Column::categorical(&["s2", "s1", "s2"]));
        let groups = t.unwrap().group_by("site").unwrap();
        let names: Vec<_> = groups
            .iter()
            .map(|(n, t)| (n.as_str(), t.n_rows()))
            .collect();
        assert_eq!(names, vec![("s1", 1), ("s2", 2)]);
        assert!(groups[0].1.column("site").is_none());
        let tables: Vec<Table> = groups.into_iter().map(|(_, t)| t).collect();
        let pooled = Table::concat(&tables).unwrap();
        assert_eq!(pooled.n_rows(), 3);
        assert_eq!(pooled.column("sex").unwrap().level(0), Some("f"));
    }
}

mod cdc {
    use super::*;

    fn cdc_zip() -> PathBuf {
        let p = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/data"))
            .join(CDC_2015_ZIP);
        assert!(
            p.exists(),
            "the CDC 2015 linked file is missing at {}; this test needs the shared data folder",
            p.display()
        );
        p
    }

    #[test]
    fn loads_the_2015_file_with_documented_counts() {
        let data = load_cdc(&cdc_zip(), &CdcOptions::default()).unwrap();
        eprintln!("{}", data.describe());
        let s = &data.summary;
        assert_eq!(s.records, 23_357);
        assert_eq!(s.unusable_block, 357);
        assert_eq!(s.incomplete, 2_707);
        assert_eq!(s.kept, 20_293);
        assert_eq!(
            s.missing,
            vec![
                ("revis".to_string(), 1836),
                ("meduc".to_string(), 975),
                ("combgest".to_string(), 201),
                ("brthwgt".to_string(), 143)
            ]
        );
        let sizes: Vec<_> = data
            .clients
            .iter()
            .map(|c| (c.name.as_str(), c.table.n_rows(), c.dropped_for_extras))
            .collect();
        assert_eq!(
            sizes,
            vec![
                ("resident", 12_902, 156),
                ("intrastate_nonresident", 6_435, 17),
                ("interstate_or_foreign", 783, 0)
            ]
        );
        let total: usize = data
            .clients
            .iter()
            .map(|c| c.table.n_rows() + c.dropped_for_extras)
            .sum();
        assert_eq!(total, s.kept);

        // Feature set: core features first, then the client's extras.
        let resident = &data.clients[0].table;
        let mut expect: Vec<&str> = CDC_FEATURES.to_vec();
        expect.extend(["marital_status", "smoking"]);
        assert_eq!(resident.names(), expect.as_slice());
        assert_eq!(
            data.clients[1].extras,
            vec![CdcExtra::BirthOrder.name().to_string()]
        );
        assert!(data.clients[2].extras.is_empty());
        for (name, col) in resident.iter() {
            let real = matches!(col, Column::Real(_));
            let expect_real = matches!(
                name,
                "mother_age"
                    | "prenatal_visits"
                    | "gestation_weeks"
                    | "birth_weight_g"
                    | "age_at_death_days"
            );
            assert_eq!(real, expect_real, "{name}");
        }

        // No NaN anywhere, values inside documented ranges, and the pooled table encodes.
        let pooled = data.pooled().unwrap();
        assert_eq!(pooled.n_rows(), 20_120);
        let range = |n: &str| match pooled.column(n).unwrap() {
            Column::Real(v) => v.iter().fold((f32::MAX, f32::MIN), |(a, b), &x| {
                assert!(x.is_finite());
                (a.min(x), b.max(x))
            }),
            _ => panic!("{n} is not real"),
        };
        assert!(range("birth_weight_g").0 >= 227.0 && range("birth_weight_g").1 <= 8165.0);
        assert!(range("gestation_weeks").1 <= 47.0);
        assert!(range("age_at_death_days").1 <= 364.0);
        let stats: Vec<_> = data.clients.iter().map(|c| c.table.stats()).collect();
        let enc = Encoding::merge(&stats).unwrap();
        let core = enc.subset(CDC_FEATURES).unwrap();
        let e = core.encode(&pooled).unwrap();
        assert!(e.x.iter().all(|v| v.is_finite() && (0.0..=1.0).contains(v)));
        // 5 reals + 6 races + 8 education levels + 3 + 2 + 3 + 9.
        assert_eq!(e.width(), 5 + 6 + 8 + 3 + 2 + 3 + 9);
        // Extras appear in the merged encoding too (for stitching).
        assert!(enc.feature("smoking").is_some() && enc.feature("birth_order").is_some());
    }

    #[test]
    fn birth_quarter_split_covers_every_kept_row() {
        let data = load_cdc(&cdc_zip(), &CdcOptions::new(CdcSplit::BirthQuarter)).unwrap();
        let sizes: Vec<usize> = data.clients.iter().map(|c| c.table.n_rows()).collect();
        assert_eq!(sizes, vec![4_786, 5_149, 5_296, 5_062]);
        assert_eq!(sizes.iter().sum::<usize>(), data.summary.kept);
    }

    #[test]
    fn extras_for_an_unknown_client_are_rejected() {
        let mut opts = CdcOptions::new(CdcSplit::BirthQuarter);
        opts.extras
            .insert("resident".into(), vec![CdcExtra::Smoking]);
        let err = load_cdc(&cdc_zip(), &opts).unwrap_err();
        assert!(err.to_string().contains("q1"), "{err}");
    }
}

mod bad_input {
    use super::*;

    const HEADER: &str = "mager,mrace6,meduc,revis,dplural,sex,combgest,brthwgt,aged,ucod,wic,\
                          restatus,dob_mm,dmar,tbo_rec,cig_rec";
    const GOOD: &str = "25,1,3,10,1,M,39,3200,5,P072,N,1,3,1,2,N";

    fn zip_with(dir: &Path, member: &str, text: &str) -> PathBuf {
        let path = dir.join("cdc.zip");
        let file = std::fs::File::create(&path).unwrap();
        let mut z = zip::ZipWriter::new(file);
        let opts = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored);
        z.start_file(member, opts).unwrap();
        z.write_all(text.as_bytes()).unwrap();
        z.finish().unwrap();
        path
    }

    #[test]
    fn a_small_valid_file_loads() {
        let dir = tempfile::tempdir().unwrap();
        let text = format!("{HEADER}\n{GOOD}\n{}\n", GOOD.replace(",3200,", ",9999,"));
        let data = load_cdc(
            &zip_with(dir.path(), "x.csv", &text),
            &CdcOptions::new(CdcSplit::ResidenceStatus),
        )
        .unwrap();
        assert_eq!(data.summary.kept, 1);
        assert_eq!(data.summary.missing, vec![("brthwgt".to_string(), 1)]);
        let t = &data.clients[0].table;
        assert_eq!(
            t.column("death_age").unwrap().level(0),
            Some("early_neonatal")
        );
        assert_eq!(
            t.column("cause_of_death").unwrap().level(0),
            Some("perinatal")
        );
        // A plain CSV works as well.
        let csv = dir.path().join("x.csv");
        std::fs::write(&csv, &text).unwrap();
        assert_eq!(
            load_cdc(&csv, &CdcOptions::default()).unwrap().summary.kept,
            1
        );
    }

    #[test]
    fn zip_without_csv_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = zip_with(dir.path(), "readme.txt", "hello");
        let err = load_cdc(&path, &CdcOptions::default()).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, DataError::Format { .. }), "{msg}");
        assert!(
            msg.contains("cdc.zip") && msg.contains("no .csv member") && msg.contains("readme.txt"),
            "{msg}"
        );
    }

    #[test]
    fn missing_column_names_file_and_column() {
        let dir = tempfile::tempdir().unwrap();
        let header = HEADER.replace("combgest", "gestation");
        let path = zip_with(dir.path(), "x.csv", &format!("{header}\n{GOOD}\n"));
        let err = load_cdc(&path, &CdcOptions::default()).unwrap_err();
        let msg = err.to_string();
        match &err {
            DataError::MissingColumn {
                source_name,
                column,
                ..
            } => {
                assert_eq!(column, "combgest");
                assert!(source_name.contains("cdc.zip!x.csv"), "{msg}");
            }
            other => panic!("expected MissingColumn, got {other:?}"),
        }
    }

    #[test]
    fn malformed_number_names_file_line_and_column() {
        let dir = tempfile::tempdir().unwrap();
        let bad = GOOD.replacen("25,", "2x5,", 1);
        let path = zip_with(dir.path(), "x.csv", &format!("{HEADER}\n{GOOD}\n{bad}\n"));
        let err = load_cdc(&path, &CdcOptions::default()).unwrap_err();
        let msg = err.to_string();
        match &err {
            DataError::Csv {
                path, line, column, ..
            } => {
                assert_eq!(*line, 3);
                assert!(column.contains("mager"), "{msg}");
                assert!(path.to_string_lossy().contains("cdc.zip"), "{msg}");
            }
            other => panic!("expected Csv, got {other:?}"),
        }
        assert!(msg.contains("2x5"), "{msg}");
    }
}

mod ggm {
    use super::*;

    #[test]
    fn precision_is_positive_definite_with_the_graph_pattern() {
        for (seed, shape) in [
            (1, GraphShape::Random { edge_prob: 0.2 }),
            (2, GraphShape::Chain),
            (3, GraphShape::Grid { cols: 4 }),
        ] {
            let g = sample_ggm(
                &GgmConfig::new(16, 10, shape.clone()),
                &mut StdRng::seed_from_u64(seed),
            )
            .unwrap();
            let d = g.d;
            assert!(cholesky(&g.precision, d).is_some(), "{shape:?}");
            assert!(g.num_edges() > 0);
            for i in 0..d {
                assert!(!g.adjacency[i * d + i]);
                for j in 0..d {
                    if i != j {
                        assert_eq!(g.precision[i * d + j] != 0.0, g.adjacency[i * d + j]);
                        assert_eq!(g.precision[i * d + j], g.precision[j * d + i]);
                    }
                }
                // Covariance is the inverse: (Θ Σ)_ii = 1.
                let dot: f64 = (0..d)
                    .map(|k| g.precision[i * d + k] * g.covariance[k * d + i])
                    .sum();
                assert!((dot - 1.0).abs() < 1e-10);
            }
        }
    }

    #[test]
    fn sample_covariance_matches_the_truth() {
        let cfg = GgmConfig::new(10, 20_000, GraphShape::Random { edge_prob: 0.3 });
        let g = sample_ggm(&cfg, &mut StdRng::seed_from_u64(7)).unwrap();
        let (n, d) = (g.n, g.d);
        let mut worst = 0f64;
        for i in 0..d {
            for j in 0..d {
                let s: f64 = (0..n)
                    .map(|r| g.samples[r * d + i] * g.samples[r * d + j])
                    .sum::<f64>()
                    / n as f64;
                let t = g.covariance[i * d + j];
                // Standard error of a sample covariance: sqrt((Σ_ii Σ_jj + Σ_ij²) / n).
                let se =
                    ((g.covariance[i * d + i] * g.covariance[j * d + j] + t * t) / n as f64).sqrt();
                worst = worst.max((s - t).abs() / se);
            }
        }
        // 100 entries (55 distinct): 4.5 standard errors is a generous bound.
        assert!(worst < 4.5, "worst deviation {worst} standard errors");
    }

    #[test]
    fn same_seed_same_model() {
        let cfg = GgmConfig::new(8, 50, GraphShape::Random { edge_prob: 0.3 });
        let a = sample_ggm(&cfg, &mut StdRng::seed_from_u64(5)).unwrap();
        let b = sample_ggm(&cfg, &mut StdRng::seed_from_u64(5)).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn conditional_mean_matches_the_covariance_formula() {
        // Σ = [[2, 1, 0.5], [1, 2, 1], [0.5, 1, 2]]; given x0 = 1, x2 = -1:
        // E[x1 | x0, x2] = Σ_1k Σ_kk⁻¹ x_k. Σ_kk = [[2, .5], [.5, 2]], inverse /3.75 *
        // [[2, -.5], [-.5, 2]]; Σ_1k = [1, 1]; so [1, 1]·[[2,-.5],[-.5,2]]·[1,-1]/3.75 =
        // [1.5, 1.5]·[1, -1]/3.75 = 0.
        // With x2 = 0 instead: [1.5, 1.5]·[1, 0]/3.75 = 0.4.
        let cov = [2.0, 1.0, 0.5, 1.0, 2.0, 1.0, 0.5, 1.0, 2.0];
        let l = cholesky(&cov, 3).unwrap();
        // Invert Σ via its Cholesky factor (columns of the identity).
        let mut prec = [0f64; 9];
        for j in 0..3 {
            let mut y = [0f64; 3];
            y[j] = 1.0;
            for i in 0..3 {
                let s: f64 = (0..i).map(|k| l[i * 3 + k] * y[k]).sum();
                y[i] = (y[i] - s) / l[i * 3 + i];
            }
            for i in (0..3).rev() {
                let s: f64 = (i + 1..3).map(|k| l[k * 3 + i] * y[k]).sum();
                y[i] = (y[i] - s) / l[i * 3 + i];
            }
            for i in 0..3 {
                prec[i * 3 + j] = y[i];
            }
        }
        let m = conditional_mean(&prec, &[0.0; 3], &[0, 2], &[1.0, -1.0]).unwrap();
        assert!(m[0].abs() < 1e-12, "{m:?}");
        let m = conditional_mean(&prec, &[0.0; 3], &[0, 2], &[1.0, 0.0]).unwrap();
        assert!((m[0] - 0.4).abs() < 1e-12, "{m:?}");
        // A non-zero mean shifts the answer.
        let m = conditional_mean(&prec, &[1.0, 2.0, 3.0], &[0, 2], &[2.0, 3.0]).unwrap();
        assert!((m[0] - 2.4).abs() < 1e-12, "{m:?}");
        assert!(conditional_mean(&prec, &[0.0; 3], &[0, 0], &[1.0, 1.0]).is_err());
    }
}
