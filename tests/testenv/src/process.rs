//! Child processes that cannot outlive the test process.
//!
//! Every process this crate starts (the components, and `go` while building) gets
//! `PR_SET_PDEATHSIG = SIGKILL`, so the kernel kills it when its parent goes away: on a
//! panic that aborts, a `SIGKILL` of the test binary, or a normal exit that never drops a
//! `static` plane. Linux sends that signal when the *thread* that forked the child exits, not
//! the process, so all forks happen on one spawner thread that is never joined and lives as
//! long as the process. (A fork from a `#[tokio::test]` thread would kill the shared plane as
//! soon as the first test finished.)
//!
//! Stopping in order is the job of [`Component::stop`]: `SIGTERM`, a grace period, `SIGKILL`.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal};

use crate::error::{Error, Result};

/// How many log lines an error about a component shows.
pub(crate) const TAIL_LINES: usize = 30;

type SpawnRequest = (Command, mpsc::Sender<io::Result<Child>>);

/// Spawns `cmd` so that it cannot outlive this process: from the process-lifetime spawner
/// thread, with `PR_SET_PDEATHSIG = SIGKILL`. Tests use it for every process they start.
pub fn spawn(mut cmd: Command) -> io::Result<Child> {
    let parent = rustix::process::getpid();
    let arm_death_signal = move || {
        rustix::process::set_parent_process_death_signal(Some(Signal::KILL))?;
        // The parent may have died between fork and prctl; then nobody would ever kill us.
        if rustix::process::getppid() != Some(parent) {
            return Err(io::Error::other("parent exited before the child started"));
        }
        Ok(())
    };
    // SAFETY: the closure runs between fork and exec, where only async-signal-safe calls are
    // allowed; prctl and getppid are plain system calls that neither allocate nor lock.
    #[allow(unsafe_code)] // pre_exec is the only way to arm PR_SET_PDEATHSIG in the child.
    unsafe {
        cmd.pre_exec(arm_death_signal);
    }

    let (reply_tx, reply_rx) = mpsc::channel();
    spawner()
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .send((cmd, reply_tx))
        .map_err(|_| io::Error::other("the spawner thread is gone"))?;
    reply_rx
        .recv()
        .map_err(|_| io::Error::other("the spawner thread is gone"))?
}

fn spawner() -> &'static Mutex<mpsc::Sender<SpawnRequest>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        thread::Builder::new()
            .name("testenv-spawner".into())
            .spawn(move || {
                // The sender lives in a static and is never dropped, so this loop never ends
                // and the thread, the parent of every child, lives until the process exits.
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("spawning the testenv-spawner thread");
        Mutex::new(tx)
    })
}

/// One running component: its process and the log file holding its stdout and stderr.
#[derive(Debug)]
pub(crate) struct Component {
    pub(crate) name: &'static str,
    pub(crate) log: PathBuf,
    child: Child,
    /// Set once the process has been reaped.
    exit: Option<ExitStatus>,
}

impl Component {
    /// Starts `program args…` with stdout and stderr appended to `log`.
    ///
    /// The child gets its own process group, so a Ctrl-C in the terminal reaches only the
    /// test process, which then stops the components in order instead of all at once.
    pub(crate) fn start(name: &'static str, mut cmd: Command, log: PathBuf) -> Result<Component> {
        let out =
            File::create(&log).map_err(|e| Error::io(format!("creating {}", log.display()), e))?;
        let err = out
            .try_clone()
            .map_err(|e| Error::io(format!("duplicating {}", log.display()), e))?;
        cmd.stdin(std::process::Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        let child = spawn(cmd).map_err(|e| Error::io(format!("starting {name}"), e))?;
        Ok(Component {
            name,
            log,
            child,
            exit: None,
        })
    }

    /// The process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The exit status if the process has ended, without blocking.
    pub(crate) fn exited(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none() {
            self.exit = self.child.try_wait().ok().flatten();
        }
        self.exit
    }

    /// An error naming this component, with the tail of its log.
    pub(crate) fn error(&self, problem: impl Into<String>) -> Error {
        Error::Component {
            component: self.name,
            problem: problem.into(),
            log: self.log.clone(),
            tail: tail(&self.log, TAIL_LINES),
        }
    }

    /// `Err` naming the component if it has exited.
    pub(crate) fn ensure_running(&mut self) -> Result<()> {
        match self.exited() {
            None => Ok(()),
            Some(status) => Err(self.error(format!("exited unexpectedly ({status})"))),
        }
    }

    /// Sends `SIGTERM`, waits up to `grace` for the exit, then sends `SIGKILL` and reaps.
    pub(crate) fn stop(&mut self, grace: Duration) {
        if self.exited().is_some() {
            return;
        }
        if let Some(pid) = Pid::from_raw(self.child.id() as i32) {
            let _ = rustix::process::kill_process(pid, Signal::TERM);
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if self.exited().is_some() {
                return;
            }
            thread::sleep(Duration::from_millis(20));
        }
        tracing::warn!(
            component = self.name,
            ?grace,
            "did not stop after SIGTERM; killing it"
        );
        let _ = self.child.kill();
        self.exit = self.child.wait().ok();
    }
}

/// The last `lines` lines of a log file, read from its end so a large log costs nothing.
pub(crate) fn tail(path: &Path, lines: usize) -> String {
    const MAX_BYTES: u64 = 64 * 1024;
    let read = || -> io::Result<String> {
        let mut file = File::open(path)?;
        let len = file.metadata()?.len();
        file.seek(SeekFrom::Start(len.saturating_sub(MAX_BYTES)))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    };
    match read() {
        Ok(text) => {
            let all: Vec<&str> = text.lines().collect();
            let tail = all[all.len().saturating_sub(lines)..].join("\n");
            if tail.is_empty() {
                "(empty)".into()
            } else {
                tail
            }
        }
        Err(e) => format!("(cannot read it: {e})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_the_last_lines() {
        let dir = std::env::temp_dir().join(format!("testenv-tail-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("log");
        let text: String = (1..=100).map(|i| format!("line {i}\n")).collect();
        std::fs::write(&log, text).unwrap();
        assert_eq!(tail(&log, 2), "line 99\nline 100");
        assert_eq!(
            tail(&dir.join("missing"), 2).split(':').next(),
            Some("(cannot read it")
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn children_stop_on_sigterm() {
        let mut cmd = Command::new("sleep");
        cmd.arg("600");
        let log = std::env::temp_dir().join(format!("testenv-sleep-{}.log", std::process::id()));
        let mut c = Component::start("sleep", cmd, log.clone()).unwrap();
        assert!(c.ensure_running().is_ok());
        c.stop(Duration::from_secs(5));
        assert!(c.exited().is_some());
        let err = c.ensure_running().unwrap_err().to_string();
        assert!(err.starts_with("sleep exited unexpectedly"), "{err}");
        std::fs::remove_file(log).unwrap();
    }
}
