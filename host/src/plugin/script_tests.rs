//! `wasmop test`'s work: finds a script plugin's test files and fixtures in a directory and runs
//! them in the sandbox (see [`Sandbox::test_script`]).
//!
//! A directory holds one script (`*.star`), its tests (`*_test.star`) and fixtures: every
//! `*.yaml`, `*.yml` and `*.json` file beside them, which test files read as
//! `FIXTURES["name.yaml"]` (a file of several YAML documents gives a list). Everything read is
//! bounded: a script or test file as a ConfigMap holds, a fixture at most [`MAX_FIXTURE`].
//!
//! ```no_run
//! use wasmop::plugin::script_tests;
//! use wasmop::sandbox::Limits;
//!
//! let suite = script_tests::Suite::find(std::path::Path::new("plugins/memcached-star"))?;
//! let outcomes = suite.run(Limits::default())?;
//! assert!(outcomes.iter().all(|o| o.failure.is_none()));
//! # anyhow::Ok(())
//! ```

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde_json::{Map, Value};

use crate::plugin::package::CONFIGMAP_LIMIT;
use crate::sandbox::{Language, Limits, Sandbox, SandboxConfig, TestFile, TestOutcome};

/// The largest fixture file read.
pub const MAX_FIXTURE: u64 = 1024 * 1024;
/// The most bytes of fixtures together: every test call carries them all.
pub const MAX_FIXTURES: u64 = 8 * 1024 * 1024;

/// A script, its test files and its fixtures, as read from one directory.
#[derive(Debug)]
pub struct Suite {
    /// The script's path.
    pub script: PathBuf,
    language: Language,
    source: String,
    /// The test files, by name.
    pub tests: Vec<TestFile>,
    /// File name → decoded content.
    pub fixtures: Map<String, Value>,
}

impl Suite {
    /// Reads `path`: a directory with one script, or a script (its directory gives the tests).
    pub fn find(path: &Path) -> anyhow::Result<Self> {
        let (dir, script) = if path.is_dir() {
            (path.to_owned(), None)
        } else {
            let dir = path.parent().filter(|p| !p.as_os_str().is_empty());
            (
                dir.unwrap_or(Path::new(".")).to_owned(),
                Some(path.to_owned()),
            )
        };
        let mut scripts = Vec::new();
        let mut tests = Vec::new();
        let mut fixtures = Vec::new();
        let entries =
            std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?;
        for entry in entries {
            let path = entry?.path();
            if !path.is_file() {
                continue;
            }
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            if name.ends_with("_test.star") {
                tests.push(path);
            } else if Language::of_key(&name).is_some() {
                scripts.push(path);
            } else if [".yaml", ".yml", ".json"].iter().any(|e| name.ends_with(e)) {
                fixtures.push(path);
            }
        }
        let script = match script {
            Some(script) => script,
            None => match scripts.as_slice() {
                [one] => one.clone(),
                [] => bail!("no script (*.star) in {}", dir.display()),
                many => bail!(
                    "{} scripts in {} ({}); name the one to test: wasmop test {}/<script>.star",
                    many.len(),
                    dir.display(),
                    names(many),
                    dir.display()
                ),
            },
        };
        let name = script.file_name().unwrap_or_default().to_string_lossy();
        let language = Language::of_key(&name)
            .with_context(|| format!("{} is not a script (*.star)", script.display()))?;
        if tests.is_empty() {
            bail!(
                "no test files (*_test.star) beside {} in {}",
                name,
                dir.display()
            );
        }
        tests.sort();
        fixtures.sort();
        let source = read_text(&script, CONFIGMAP_LIMIT as u64)?;
        let tests = tests
            .iter()
            .map(|path| {
                Ok(TestFile {
                    name: file_name(path),
                    source: read_text(path, CONFIGMAP_LIMIT as u64)?,
                })
            })
            .collect::<anyhow::Result<_>>()?;
        let mut decoded = Map::new();
        let mut total = 0;
        for path in &fixtures {
            let text = read_text(path, MAX_FIXTURE)?;
            total += text.len() as u64;
            if total > MAX_FIXTURES {
                bail!(
                    "fixtures in {} come to more than {} MiB together; tests carry them all",
                    dir.display(),
                    MAX_FIXTURES >> 20
                );
            }
            decoded.insert(file_name(path), decode(path, &text)?);
        }
        Ok(Self {
            script,
            language,
            source,
            tests,
            fixtures: decoded,
        })
    }

    /// Runs every test function under `limits`, in a small sandbox of its own. Fails only when
    /// the script does not load.
    pub fn run(&self, limits: Limits) -> anyhow::Result<Vec<TestOutcome>> {
        let sandbox = Sandbox::new(SandboxConfig {
            max_instances: 2,
            ..SandboxConfig::default()
        })?;
        let name = file_name(&self.script);
        sandbox
            .test_script(
                self.language,
                &name,
                &self.source,
                &self.tests,
                &Value::Object(self.fixtures.clone()),
                &limits,
            )
            .with_context(|| format!("loading {}", self.script.display()))
    }
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned()
}

fn names(paths: &[PathBuf]) -> String {
    let mut names: Vec<String> = paths.iter().map(|p| file_name(p)).collect();
    names.sort();
    names.join(", ")
}

/// The UTF-8 text of `path`, refused past `max` bytes before it is read.
fn read_text(path: &Path, max: u64) -> anyhow::Result<String> {
    let size = std::fs::metadata(path)
        .with_context(|| format!("reading {}", path.display()))?
        .len();
    if size > max {
        bail!(
            "{} is {size} bytes, over the {max} bytes it may have",
            path.display()
        );
    }
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    String::from_utf8(bytes).with_context(|| format!("{} is not UTF-8 text", path.display()))
}

/// A fixture's value: JSON as it is; YAML one document as it is, several as a list.
fn decode(path: &Path, text: &str) -> anyhow::Result<Value> {
    let what = || format!("fixture {}", path.display());
    if path.extension().is_some_and(|e| e == "json") {
        return serde_json::from_str(text).with_context(what);
    }
    let mut docs = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(text) {
        let value: Value = serde::Deserialize::deserialize(doc).with_context(what)?;
        if !value.is_null() {
            docs.push(value);
        }
    }
    Ok(match docs.len() {
        1 => docs.remove(0),
        _ => Value::Array(docs),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An empty directory of its own, removed when dropped.
    struct Dir(PathBuf);

    impl Dir {
        fn new(name: &str) -> Self {
            let path = std::env::temp_dir()
                .join(format!("wasmop-script-tests-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&path);
            std::fs::create_dir_all(&path).unwrap();
            Self(path)
        }

        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn yaml_fixtures_are_one_value_or_a_list() {
        let one = decode(Path::new("a.yaml"), "kind: Memcached\nspec: {size: 3}\n").unwrap();
        assert_eq!(one["spec"]["size"], 3);
        let two = decode(Path::new("b.yaml"), "a: 1\n---\nb: 2\n---\n").unwrap();
        assert_eq!(two, serde_json::json!([{"a": 1}, {"b": 2}]));
        let json = decode(Path::new("c.json"), "[1, 2]").unwrap();
        assert_eq!(json, serde_json::json!([1, 2]));
        let err = decode(Path::new("d.json"), "{").unwrap_err();
        assert!(format!("{err:#}").contains("fixture d.json"), "{err:#}");
    }

    #[test]
    fn a_directory_needs_one_script_and_a_test() {
        let dir = Dir::new("one-script");
        let err = Suite::find(dir.path()).unwrap_err().to_string();
        assert!(err.starts_with("no script"), "{err}");
        std::fs::write(dir.path().join("a.star"), "").unwrap();
        let err = Suite::find(dir.path()).unwrap_err().to_string();
        assert!(err.starts_with("no test files"), "{err}");
        std::fs::write(dir.path().join("b.star"), "").unwrap();
        std::fs::write(dir.path().join("a_test.star"), "").unwrap();
        let err = Suite::find(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("2 scripts") && err.contains("a.star, b.star"),
            "{err}"
        );
        let suite = Suite::find(&dir.path().join("a.star")).unwrap();
        assert_eq!(suite.tests.len(), 1);
        assert_eq!(suite.tests[0].name, "a_test.star");
    }

    #[test]
    fn an_oversized_fixture_is_refused_unread() {
        let dir = Dir::new("oversized");
        std::fs::write(dir.path().join("p.star"), "").unwrap();
        std::fs::write(dir.path().join("p_test.star"), "").unwrap();
        let big = dir.path().join("big.json");
        std::fs::File::create(&big)
            .unwrap()
            .set_len(MAX_FIXTURE + 1)
            .unwrap();
        let err = Suite::find(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("big.json") && err.contains("over the"),
            "{err}"
        );
    }
}
