use std::collections::HashMap;

use crate::{CoreError, ParamShape, Result};

/// Most tensors one set may hold: far above any network's layer count, low enough that a
/// file or reply claiming millions of tiny tensors is refused early.
pub const MAX_TENSORS: usize = 100_000;

/// A dense f32 tensor: shape and row-major (C order) values.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    /// Shape, PyTorch layout.
    pub shape: Vec<usize>,
    /// Values, row-major.
    pub data: Vec<f32>,
}

impl Tensor {
    /// A tensor, checking that `data` fills `shape`.
    pub fn new(name: &str, shape: Vec<usize>, data: Vec<f32>) -> Result<Self> {
        // Checked: a declared shape whose product wraps around could match a short buffer.
        let expected = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
        if expected != Some(data.len()) {
            let expected = expected.unwrap_or(usize::MAX);
            return Err(CoreError::ShapeMismatch {
                name: name.to_string(),
                shape,
                expected,
                actual: data.len(),
            });
        }
        Ok(Self { shape, data })
    }

    /// Rows of a matrix view: the first axis (output units for weights).
    pub fn rows(&self) -> usize {
        self.shape.first().copied().unwrap_or(1)
    }

    /// Values per row: the product of all axes but the first.
    pub fn row_len(&self) -> usize {
        self.shape.iter().skip(1).product()
    }
}

/// Ordered, named parameter tensors (a PyTorch `state_dict` of f32).
#[derive(Clone, Debug, Default)]
pub struct Params {
    names: Vec<String>,
    tensors: Vec<Tensor>,
    /// Position of each name: pushing and looking up stay O(1), so reading n tensors is O(n).
    index: HashMap<String, usize>,
}

impl PartialEq for Params {
    fn eq(&self, other: &Self) -> bool {
        // The index follows from the names.
        self.names == other.names && self.tensors == other.tensors
    }
}

impl Params {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Zeros in the given layout.
    pub fn zeros(layout: &[ParamShape]) -> Self {
        let mut p = Self::new();
        for s in layout {
            let n = s.shape.iter().product();
            p.index.insert(s.name.clone(), p.names.len());
            p.names.push(s.name.clone());
            p.tensors.push(Tensor {
                shape: s.shape.clone(),
                data: vec![0.0; n],
            });
        }
        p
    }

    /// Appends a tensor; its name must be new and its data must fill its shape.
    pub fn push(
        &mut self,
        name: impl Into<String>,
        shape: Vec<usize>,
        data: Vec<f32>,
    ) -> Result<()> {
        let name = name.into();
        if self.index.contains_key(&name) {
            return Err(CoreError::DuplicateTensor(name));
        }
        if self.names.len() >= MAX_TENSORS {
            return Err(CoreError::TooManyTensors(MAX_TENSORS));
        }
        let t = Tensor::new(&name, shape, data)?;
        self.index.insert(name.clone(), self.names.len());
        self.names.push(name);
        self.tensors.push(t);
        Ok(())
    }

    /// The same tensors, in the same order, each under `rename(name)` where that gives a
    /// name (else its own); the new names must differ from each other.
    pub fn renamed(self, rename: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let mut out = Self::new();
        for (name, t) in self.names.into_iter().zip(self.tensors) {
            let name = rename(&name).unwrap_or(name);
            if out.index.contains_key(&name) {
                return Err(CoreError::DuplicateTensor(name));
            }
            out.index.insert(name.clone(), out.names.len());
            out.names.push(name);
            out.tensors.push(t);
        }
        Ok(out)
    }

    /// The tensor called `name`.
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }

    /// The tensor called `name`, or an error naming it.
    pub fn require(&self, name: &str) -> Result<&Tensor> {
        self.get(name)
            .ok_or_else(|| CoreError::MissingTensor(name.to_string()))
    }

    /// Mutable access to the tensor called `name`.
    pub fn get_mut(&mut self, name: &str) -> Option<&mut Tensor> {
        self.index.get(name).map(|&i| &mut self.tensors[i])
    }

    /// Takes the tensor called `name` out of the set (the others keep their order).
    pub fn remove(&mut self, name: &str) -> Option<Tensor> {
        let i = self.index.remove(name)?;
        self.names.remove(i);
        for later in &self.names[i..] {
            if let Some(pos) = self.index.get_mut(later) {
                *pos -= 1;
            }
        }
        Some(self.tensors.remove(i))
    }

    /// The tensors by name, moved out of the set (no copy of their values).
    pub fn into_map(self) -> HashMap<String, Tensor> {
        self.names.into_iter().zip(self.tensors).collect()
    }

    /// Tensors in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, &Tensor)> {
        self.names
            .iter()
            .map(String::as_str)
            .zip(self.tensors.iter())
    }

    /// Tensors in order, mutable values.
    pub fn iter_mut(&mut self) -> impl ExactSizeIterator<Item = (&str, &mut Tensor)> {
        self.names
            .iter()
            .map(String::as_str)
            .zip(self.tensors.iter_mut())
    }

    /// The i-th tensor in order.
    pub fn tensor_at(&self, i: usize) -> Option<&Tensor> {
        self.tensors.get(i)
    }

    /// Names in order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// True when there are no tensors.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// Total number of scalar values.
    pub fn num_values(&self) -> usize {
        self.tensors.iter().map(|t| t.data.len()).sum()
    }

    /// The layout (names and shapes) of this set.
    pub fn layout(&self) -> Vec<ParamShape> {
        self.iter()
            .map(|(name, t)| ParamShape {
                name: name.to_string(),
                shape: t.shape.clone(),
            })
            .collect()
    }

    /// Checks that this set has exactly `layout` (same names, order and shapes).
    pub fn check_layout(&self, layout: &[ParamShape]) -> Result<()> {
        if self.len() != layout.len() {
            let names = |names: Vec<&str>| match names.len() {
                0 => "none".to_string(),
                n if n > 8 => format!("{}, ... ({n} in all)", names[..8].join(", ")),
                _ => names.join(", "),
            };
            return Err(CoreError::LayoutMismatch(format!(
                "{} tensors where {} were expected (given: {}; expected: {})",
                self.len(),
                layout.len(),
                names(self.names.iter().map(String::as_str).collect()),
                names(layout.iter().map(|p| p.name.as_str()).collect())
            )));
        }
        for ((name, t), want) in self.iter().zip(layout) {
            if name != want.name || t.shape != want.shape {
                return Err(CoreError::LayoutMismatch(format!(
                    "tensor `{name}` {:?} where `{}` {:?} was expected",
                    t.shape, want.name, want.shape
                )));
            }
        }
        Ok(())
    }

    /// These tensors in the order of `layout`, which must name each of them once with its
    /// shape: a file written elsewhere (PyTorch's safetensors keep no order) fits a model.
    pub fn arranged(&self, layout: &[ParamShape]) -> Result<Self> {
        self.in_layout(layout).map(std::borrow::Cow::into_owned)
    }

    /// [`Self::arranged`] without a copy when the tensors are in the layout's order already
    /// (a file fedfuse wrote, or one read into the list's order): a model's tensors can be
    /// hundreds of megabytes.
    pub fn in_layout(&self, layout: &[ParamShape]) -> Result<std::borrow::Cow<'_, Self>> {
        let wanted: std::collections::HashSet<&str> =
            layout.iter().map(|s| s.name.as_str()).collect();
        let few = |names: Vec<&str>| {
            let n = names.len();
            let shown: Vec<&str> = names.into_iter().take(8).collect();
            format!(
                "{n} ({}{})",
                shown.join(", "),
                if n > 8 { ", ..." } else { "" }
            )
        };
        let missing: Vec<&str> = layout
            .iter()
            .map(|s| s.name.as_str())
            .filter(|n| self.get(n).is_none())
            .collect();
        let extra: Vec<&str> = self
            .names
            .iter()
            .map(String::as_str)
            .filter(|n| !wanted.contains(n))
            .collect();
        if !missing.is_empty() || !extra.is_empty() {
            return Err(CoreError::LayoutMismatch(format!(
                "tensors the model has but these weights lack: {}; tensors these weights have \
                 but the model lacks: {}",
                few(missing),
                few(extra)
            )));
        }
        for want in layout {
            let t = self.require(&want.name)?;
            if t.shape != want.shape {
                return Err(CoreError::LayoutMismatch(format!(
                    "tensor `{}` has shape {:?} where the model has {:?}",
                    want.name, t.shape, want.shape
                )));
            }
        }
        // Every name is known, none extra, and names are unique: equal lengths and order
        // mean the same sequence.
        if self.names.iter().eq(layout.iter().map(|s| &s.name)) {
            return Ok(std::borrow::Cow::Borrowed(self));
        }
        let mut out = Self::new();
        for want in layout {
            let t = self.require(&want.name)?;
            out.push(want.name.clone(), t.shape.clone(), t.data.clone())?;
        }
        Ok(std::borrow::Cow::Owned(out))
    }

    /// Checks that every value is finite, naming the first tensor that is not.
    pub fn check_finite(&self) -> Result<()> {
        for (name, t) in self.iter() {
            let count = t.data.iter().filter(|v| !v.is_finite()).count();
            if count > 0 {
                return Err(CoreError::NonFinite {
                    name: name.to_string(),
                    count,
                });
            }
        }
        Ok(())
    }

    /// [`Self::check_finite`], and batch norm's buffers within their domain: every
    /// `running_var` and every `num_batches_tracked` non-negative (an averaged count may be
    /// fractional until it is written).
    /// For models read from files or checkpoints, which training would otherwise take in
    /// silently (a negative variance gives NaN losses).
    pub fn check_values(&self) -> Result<()> {
        self.check_finite()?;
        for (name, t) in self.iter() {
            let last = name.rsplit('.').next().unwrap_or(name);
            let bad: fn(f32) -> bool = match last {
                "running_var" => |v| v < 0.0,
                "num_batches_tracked" => |v| v < 0.0,
                _ => continue,
            };
            if let Some((index, &value)) = t.data.iter().enumerate().find(|(_, v)| bad(**v)) {
                return Err(CoreError::OutOfDomain {
                    name: name.to_string(),
                    index,
                    value,
                    reason: if last == "running_var" {
                        "a variance must be at least 0"
                    } else {
                        "a count of batches must be at least 0"
                    },
                });
            }
        }
        Ok(())
    }

    /// Squared Euclidean distance to `other` (same layout assumed; extra tensors ignored).
    pub fn sq_distance(&self, other: &Params) -> f64 {
        self.tensors
            .iter()
            .zip(&other.tensors)
            .flat_map(|(a, b)| a.data.iter().zip(&b.data))
            .map(|(x, y)| {
                let d = f64::from(*x) - f64::from(*y);
                d * d
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file holding a tensor under both the list's and torchvision's name (`0.weight`
    /// and `conv1.weight`) is refused on renaming, naming it; order and values are kept
    /// otherwise.
    #[test]
    fn renaming_keeps_order_and_refuses_two_tensors_under_one_name() {
        let mut p = Params::new();
        p.push("0.weight", vec![2], vec![1.0, 2.0]).unwrap();
        p.push("conv1.weight", vec![1], vec![3.0]).unwrap();
        p.push("fc.bias", vec![1], vec![4.0]).unwrap();
        let to_list = |n: &str| (n == "conv1.weight").then(|| "0.weight".to_string());
        match p.clone().renamed(to_list) {
            Err(CoreError::DuplicateTensor(name)) => assert_eq!(name, "0.weight"),
            other => panic!("{other:?}"),
        }
        let renamed = p
            .renamed(|n| (n == "fc.bias").then(|| "14.bias".to_string()))
            .unwrap();
        assert_eq!(renamed.names(), ["0.weight", "conv1.weight", "14.bias"]);
        assert_eq!(renamed.get("14.bias").unwrap().data, [4.0]);
    }

    /// Tensors already in the layout's order are borrowed, others copied into it; a wrong
    /// shape or a missing or extra tensor is refused either way.
    #[test]
    fn in_layout_borrows_what_is_in_order_and_arranges_the_rest() {
        let shape = |name: &str, shape: Vec<usize>| ParamShape {
            name: name.into(),
            shape,
        };
        let layout = [shape("w", vec![2]), shape("b", vec![1])];
        let mut ordered = Params::new();
        ordered.push("w", vec![2], vec![1.0, 2.0]).unwrap();
        ordered.push("b", vec![1], vec![3.0]).unwrap();
        let mut reversed = Params::new();
        reversed.push("b", vec![1], vec![3.0]).unwrap();
        reversed.push("w", vec![2], vec![1.0, 2.0]).unwrap();
        assert!(matches!(
            ordered.in_layout(&layout).unwrap(),
            std::borrow::Cow::Borrowed(_)
        ));
        let arranged = reversed.in_layout(&layout).unwrap();
        assert!(matches!(arranged, std::borrow::Cow::Owned(_)));
        assert_eq!(*arranged, ordered);
        assert_eq!(reversed.arranged(&layout).unwrap(), ordered);
        let wrong = [shape("w", vec![2]), shape("b", vec![2])];
        assert!(ordered.in_layout(&wrong).is_err());
        assert!(ordered.in_layout(&layout[..1]).is_err());
    }

    #[test]
    fn batch_norm_buffers_are_checked_for_their_domain() {
        let mut p = Params::new();
        p.push("1.running_mean", vec![2], vec![-3.0, 2.0]).unwrap();
        p.push("1.running_var", vec![2], vec![0.0, 2.0]).unwrap();
        p.push("1.num_batches_tracked", vec![], vec![2.5]).unwrap();
        p.check_values().unwrap();
        let mut bad = p.clone();
        bad.remove("1.running_var");
        bad.push("1.running_var", vec![2], vec![1.0, -0.5]).unwrap();
        let e = bad.check_values().unwrap_err().to_string();
        assert!(e.contains("`1.running_var` holds -0.5 at index 1"), "{e}");
        let mut bad = p.clone();
        bad.remove("1.num_batches_tracked");
        bad.push("1.num_batches_tracked", vec![], vec![-1.0])
            .unwrap();
        assert!(bad.check_values().is_err());
        let mut bad = p;
        bad.remove("1.running_mean");
        bad.push("1.running_mean", vec![2], vec![f32::NAN, 0.0])
            .unwrap();
        assert!(bad.check_values().is_err());
    }

    #[test]
    fn a_shape_whose_product_overflows_is_refused() {
        // 2^32 * 2^32 wraps to 0 in 64 bits: it must not pass as an empty tensor.
        let e = Tensor::new("w", vec![1 << 32, 1 << 32], Vec::new()).unwrap_err();
        assert!(
            matches!(e, CoreError::ShapeMismatch { actual: 0, .. }),
            "{e}"
        );
    }

    #[test]
    fn push_checks_shape_and_duplicates() {
        let mut p = Params::new();
        assert!(p.push("a", vec![2, 2], vec![0.0; 4]).is_ok());
        assert!(matches!(
            p.push("b", vec![2, 3], vec![0.0; 4]),
            Err(CoreError::ShapeMismatch { expected: 6, .. })
        ));
        assert!(matches!(
            p.push("a", vec![1], vec![0.0]),
            Err(CoreError::DuplicateTensor(_))
        ));
    }

    #[test]
    fn lookups_follow_pushes_and_removals() {
        let mut p = Params::new();
        for (i, name) in ["a", "b", "c", "d"].iter().enumerate() {
            p.push(*name, vec![1], vec![i as f32]).unwrap();
        }
        assert!(matches!(
            p.push("c", vec![1], vec![9.0]),
            Err(CoreError::DuplicateTensor(n)) if n == "c"
        ));
        assert_eq!(p.remove("b").unwrap().data, [1.0]);
        assert_eq!(p.names(), ["a", "c", "d"]);
        for (name, want) in [("a", 0.0), ("c", 2.0), ("d", 3.0)] {
            assert_eq!(p.get(name).unwrap().data, [want], "{name}");
        }
        assert!(p.get("b").is_none());
        p.get_mut("d").unwrap().data[0] = 7.0;
        p.push("b", vec![1], vec![5.0]).unwrap();
        assert_eq!(p.names(), ["a", "c", "d", "b"]);
        assert_eq!(p.get("d").unwrap().data, [7.0]);
        assert_eq!(p.get("b").unwrap().data, [5.0]);
    }

    #[test]
    fn a_set_holds_at_most_max_tensors() {
        let mut p = Params::new();
        for i in 0..MAX_TENSORS {
            p.push(format!("t{i}"), vec![], vec![0.0]).unwrap();
        }
        assert!(matches!(
            p.push("one-more", vec![], vec![0.0]),
            Err(CoreError::TooManyTensors(MAX_TENSORS))
        ));
    }

    #[test]
    fn finite_check_names_tensor() {
        let mut p = Params::new();
        p.push("w", vec![3], vec![1.0, f32::NAN, f32::INFINITY])
            .unwrap();
        let err = p.check_finite().unwrap_err().to_string();
        assert!(err.contains("`w`") && err.contains('2'), "{err}");
    }

    #[test]
    fn layout_check_names_offender() {
        let spec = crate::ModelSpec::mlp(3, &[2], 2);
        let mut p = Params::zeros(&spec.param_shapes());
        assert!(p.check_layout(&spec.param_shapes()).is_ok());
        p.get_mut("layers.1.weight").unwrap().shape = vec![4, 1];
        let err = p
            .check_layout(&spec.param_shapes())
            .unwrap_err()
            .to_string();
        assert!(err.contains("layers.1.weight"), "{err}");
    }
}
