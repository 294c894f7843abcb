//! A string column of an Arrow batch, in any of the layouts other writers produce: plain, large
//! and view strings, dictionaries of them (pandas' categoricals, and how the receipts reader
//! decodes its low-cardinality columns), and the null type (a column null in every row). Both the
//! receipts reader and the decision-states reader read strings through it.

use std::path::Path;

use anyhow::{Result, bail};
use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, UInt32Type};
use arrow_array::{Array, ArrayRef};
use arrow_schema::DataType;

pub(crate) enum StrCol<'a> {
    Utf8(&'a arrow_array::StringArray),
    Large(&'a arrow_array::LargeStringArray),
    View(&'a arrow_array::StringViewArray),
    /// Dictionary-encoded strings (how the low-cardinality columns are decoded, see
    /// [`ParquetPlan::open`], and how pandas' categoricals arrive).
    Dict(Coded<'a>),
    Missing,
}

/// A dictionary column as it is: per row a key into the distinct values, each value looked up
/// once per batch. The column-wise rules (`batch_rules.rs`) map the values, not the rows.
pub(crate) struct Coded<'a> {
    nulls: Option<arrow_buffer::NullBuffer>,
    /// Per row, the index of its value (any number where the row is null).
    pub keys: std::borrow::Cow<'a, [u32]>,
    /// Each value; `None` where the dictionary holds a null.
    pub values: Vec<Option<&'a str>>,
}

impl<'a> Coded<'a> {
    pub fn new(
        nulls: Option<arrow_buffer::NullBuffer>,
        keys: std::borrow::Cow<'a, [u32]>,
        values: Vec<Option<&'a str>>,
    ) -> Self {
        Coded {
            nulls,
            keys,
            values,
        }
    }

    /// Rows `r` hold a null (row): whether their values are null is for the caller to see.
    #[inline]
    pub fn any_null_row(&self, r: std::ops::Range<usize>) -> bool {
        self.nulls
            .as_ref()
            .is_some_and(|n| n.null_count() > 0 && r.into_iter().any(|i| n.is_null(i)))
    }

    /// Row `i`'s value's index in `values`; `None` when the row or its value is null.
    #[inline]
    pub fn key(&self, i: usize) -> Option<usize> {
        if let Some(n) = &self.nulls
            && n.is_null(i)
        {
            return None;
        }
        let k = self.keys[i] as usize;
        self.values.get(k)?.as_ref()?;
        Some(k)
    }

    #[inline]
    pub fn get(&self, i: usize) -> Option<&'a str> {
        self.values[self.key(i)?]
    }
}

impl<'a> StrCol<'a> {
    /// The column of a receipts file: a missing column reads as all null, and a column of another
    /// type is an error naming the file and the column.
    pub fn new(a: Option<&'a ArrayRef>, name: &str, file: &Path) -> Result<Self> {
        let Some(a) = a else {
            return Ok(StrCol::Missing);
        };
        match StrCol::read(a) {
            Some(c) => Ok(c),
            None => bail!(
                "{}: column `{name}` has type {}, expected a string column",
                file.display(),
                a.data_type()
            ),
        }
    }

    /// A string column in any of Arrow's string layouts (plain, large, view, or a dictionary of
    /// any of them with any key type); a null-typed column (what pyarrow and pandas write for a
    /// column that is null in every row) reads as all null. `None` for any other type.
    pub fn read(a: &'a ArrayRef) -> Option<Self> {
        Some(match a.data_type() {
            DataType::Utf8 => StrCol::Utf8(a.as_string::<i32>()),
            DataType::LargeUtf8 => StrCol::Large(a.as_string::<i64>()),
            DataType::Utf8View => StrCol::View(a.as_string_view()),
            DataType::Dictionary(_, v)
                if matches!(
                    **v,
                    DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
                ) =>
            {
                let d = a.as_any_dictionary();
                if d.values().is_empty() {
                    // no values: every key is null
                    StrCol::Missing
                } else {
                    let values = StrCol::read(d.values())?;
                    // 32-bit keys (what the reader makes) are read in place, others converted
                    let keys = match d.keys().data_type() {
                        DataType::Int32 => std::borrow::Cow::Borrowed(
                            d.keys()
                                .as_primitive::<Int32Type>()
                                .values()
                                .inner()
                                .typed_data(),
                        ),
                        DataType::UInt32 => std::borrow::Cow::Borrowed(
                            d.keys()
                                .as_primitive::<UInt32Type>()
                                .values()
                                .inner()
                                .typed_data(),
                        ),
                        _ => std::borrow::Cow::Owned(
                            d.normalized_keys()
                                .into_iter()
                                .map(|k| u32::try_from(k).unwrap_or(u32::MAX))
                                .collect(),
                        ),
                    };
                    // the keys' nulls: a null value is told by `values`
                    StrCol::Dict(Coded::new(
                        a.nulls().cloned(),
                        keys,
                        (0..d.values().len()).map(|k| values.get(k)).collect(),
                    ))
                }
            }
            DataType::Null => StrCol::Missing,
            _ => return None,
        })
    }

    /// The column as keys into its values: a dictionary as it is, plain strings as one value
    /// per row (`n` rows), a missing column as all null.
    pub fn coded(self, n: usize) -> Coded<'a> {
        let rows = |values: Vec<Option<&'a str>>| {
            Coded::new(
                None,
                std::borrow::Cow::Owned((0..n as u32).collect()),
                values,
            )
        };
        match self {
            StrCol::Dict(c) => c,
            StrCol::Missing => Coded::new(None, std::borrow::Cow::Owned(vec![0; n]), vec![None]),
            plain => rows((0..n).map(|i| plain.get(i)).collect()),
        }
    }

    pub fn get(&self, i: usize) -> Option<&'a str> {
        match self {
            StrCol::Utf8(a) => a.is_valid(i).then(|| a.value(i)),
            StrCol::Large(a) => a.is_valid(i).then(|| a.value(i)),
            StrCol::View(a) => a.is_valid(i).then(|| a.value(i)),
            StrCol::Dict(c) => c.get(i),
            StrCol::Missing => None,
        }
    }
}
