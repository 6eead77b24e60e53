//! Operator processes: started tied to the runner (`testenv::spawn_tied`), logging to a file,
//! checked for crashes, and measured from `/proc/<pid>`.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::time::Instant;

/// One running operator process; killed on drop.
#[derive(Debug)]
pub struct Proc {
    /// What it is, for messages.
    pub name: String,
    /// Its stdout and stderr.
    pub log: PathBuf,
    child: Child,
}

impl Proc {
    /// Starts `cmd` with its output in `log`.
    pub fn spawn(name: &str, mut cmd: Command, log: PathBuf) -> Result<Proc> {
        let file = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        cmd.stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .env("NO_COLOR", "1");
        let child = testenv::spawn_tied(cmd).with_context(|| format!("starting {name}"))?;
        Ok(Proc {
            name: name.to_owned(),
            log,
            child,
        })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `Err` with the end of its log if the process has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "{} exited ({status}); end of {}:\n{}",
                self.name,
                self.log.display(),
                tail(&self.log, 20)
            );
        }
        Ok(())
    }

    /// The log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log contains `needle`; returns how long that took.
    pub async fn wait_for_log(&mut self, needle: &str, timeout: Duration) -> Result<Duration> {
        let start = Instant::now();
        loop {
            if self.log_text().contains(needle) {
                return Ok(start.elapsed());
            }
            self.check_alive()?;
            if start.elapsed() > timeout {
                bail!(
                    "{} did not log {needle:?} within {timeout:?}; end of {}:\n{}",
                    self.name,
                    self.log.display(),
                    tail(&self.log, 20)
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Memory and CPU use now.
    pub fn usage(&self) -> Result<Usage> {
        Usage::of(self.pid())
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A process's memory and CPU, from `/proc/<pid>/status` and `/proc/<pid>/stat`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    /// Resident set size now (VmRSS), in MiB.
    pub rss_mib: f64,
    /// Peak resident set size (VmHWM), in MiB.
    pub peak_mib: f64,
    /// User plus system CPU time since start, in seconds, its children's included (the host
    /// compiles plugins in child processes).
    pub cpu_secs: f64,
}

impl Usage {
    /// Reads the figures of process `pid`.
    pub fn of(pid: u32) -> Result<Usage> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .with_context(|| format!("reading /proc/{pid}/status"))?;
        let kib = |field: &str| -> f64 {
            status
                .lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .with_context(|| format!("reading /proc/{pid}/stat"))?;
        Ok(Usage {
            rss_mib: kib("VmRSS:") / 1024.0,
            peak_mib: kib("VmHWM:") / 1024.0,
            cpu_secs: cpu_seconds(&stat)?,
        })
    }

    /// The sum over several processes (peaks summed too, though they need not coincide).
    pub fn sum(all: impl IntoIterator<Item = Usage>) -> Usage {
        all.into_iter().fold(Usage::default(), |a, b| Usage {
            rss_mib: a.rss_mib + b.rss_mib,
            peak_mib: a.peak_mib + b.peak_mib,
            cpu_secs: a.cpu_secs + b.cpu_secs,
        })
    }
}

/// utime + stime + cutime + cstime (fields 14 to 17 of `/proc/<pid>/stat`: the process's own
/// CPU and that of its children it waited for) in seconds. The command name (field 2) may hold
/// spaces, so fields are counted after its closing parenthesis.
fn cpu_seconds(stat: &str) -> Result<f64> {
    let after = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .context("malformed /proc/<pid>/stat")?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    // `after` starts at field 3 (state).
    let ticks = |field: usize| -> Result<f64> {
        Ok(fields
            .get(field - 3)
            .context("short /proc/<pid>/stat")?
            .parse::<f64>()?)
    };
    let per_second = rustix::param::clock_ticks_per_second() as f64;
    Ok((ticks(14)? + ticks(15)? + ticks(16)? + ticks(17)?) / per_second)
}

/// The last `lines` lines of a file.
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_fields_follow_the_command_name() {
        let stat = "42 (a b) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 7 3 20 0 3 0 1 2 3";
        let hz = rustix::param::clock_ticks_per_second() as f64;
        assert_eq!(cpu_seconds(stat).unwrap(), 310.0 / hz);
    }

    #[test]
    fn reads_this_process() {
        let u = Usage::of(std::process::id()).unwrap();
        assert!(u.rss_mib > 0.0 && u.peak_mib >= u.rss_mib);
    }
}
