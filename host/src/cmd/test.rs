//! `wasmop test`: runs a script plugin's tests (see `plugin::script_tests`) and prints one line
//! per test function, each failure with its `file:line:column`.

use std::fmt::Write;

use crate::cli::TestArgs;
use crate::plugin::script_tests::Suite;
use crate::sandbox::{Limits, TestOutcome};

/// What `wasmop test --help` ends with.
pub const AFTER_HELP: &str = "\
A test file runs beside the script: it sees the script's MANIFEST, reconcile and related, the
fixtures as FIXTURES (every *.yaml, *.yml and *.json file in the directory, by file name),
assert_eq(got, want, msg), assert_true(cond, msg) and assert_fails(f, want) (calls f() and
wants it to fail with a message holding want); fail(msg) fails a test too.

  def test_three_replicas():
      out = reconcile({\"parent\": FIXTURES[\"sample.yaml\"], \"observed\": []})
      assert_eq(out[\"children\"][0][\"spec\"][\"replicas\"], 3)";

/// Runs `wasmop test`.
pub fn run(args: TestArgs) -> anyhow::Result<()> {
    let suite = Suite::find(&args.path)?;
    let outcomes = suite.run(Limits::from(&args.limits))?;
    super::print(&report(&outcomes))?;
    let failed = outcomes.iter().filter(|o| o.failure.is_some()).count();
    if failed > 0 {
        anyhow::bail!("{failed} of {} failed", outcomes.len());
    }
    Ok(())
}

/// One line per test, grouped by file; a failure's message below it, indented.
fn report(outcomes: &[TestOutcome]) -> String {
    let mut out = String::new();
    let mut file = None;
    for o in outcomes {
        if file != Some(&o.file) {
            let _ = writeln!(out, "{}", o.file);
            file = Some(&o.file);
        }
        let verdict = if o.failure.is_some() { "FAIL" } else { "ok  " };
        let name = o.test.as_deref().unwrap_or("(the file's top level)");
        let ms = o.elapsed.as_secs_f64() * 1000.0;
        let _ = writeln!(out, "  {verdict} {name} ({ms:.1} ms)");
        if let Some(failure) = &o.failure {
            for line in failure.lines() {
                let _ = writeln!(out, "       {line}");
            }
        }
    }
    let failed = outcomes.iter().filter(|o| o.failure.is_some()).count();
    let _ = writeln!(out, "{} passed, {failed} failed", outcomes.len() - failed);
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_report_names_each_test_and_indents_failures() {
        let outcome = |file: &str, test: Option<&str>, failure: Option<&str>| TestOutcome {
            file: file.into(),
            test: test.map(Into::into),
            failure: failure.map(Into::into),
            elapsed: Duration::from_micros(1500),
        };
        let text = report(&[
            outcome("a_test.star", Some("test_one"), None),
            outcome(
                "a_test.star",
                Some("test_two"),
                Some("a_test.star:4:5: assert_eq: got 1, want 2"),
            ),
            outcome(
                "b_test.star",
                None,
                Some("b_test.star:1:1: error: Parse error"),
            ),
        ]);
        assert_eq!(
            text,
            "a_test.star\n  ok   test_one (1.5 ms)\n  FAIL test_two (1.5 ms)\n       a_test.star:4:5: assert_eq: got 1, want 2\n\
             b_test.star\n  FAIL (the file's top level) (1.5 ms)\n       b_test.star:1:1: error: Parse error\n\
             1 passed, 2 failed\n"
        );
    }
}
