//! What happens when one of the GPU runtime's own threads panics: the process ends with an error
//! that says why, where it would otherwise wait forever.
//!
//! Burn's wgpu runtime (cubecl-wgpu 0.11.3) waits on the device from a thread it spawns without a
//! name. Nothing joins that thread, so a panic there goes unseen, and every thread then waiting
//! for the device (the run's own, reading a loss) sleeps in cubecl's queue for ever. wgpu's
//! OpenGL backend panics exactly so ("Could not lock adapter context. This is most-likely a
//! deadlock.") when its context stays locked for 6 s, which on Mesa's llvmpipe one long wait
//! for the device does. So once a wgpu device is up ([`install`], from `backend`), a panic on an
//! unnamed thread ends the process with status 2, as `decision`'s errors do, saying what the work
//! in progress gives for it ([`explain_with`]: a training run names its plan, the device's memory
//! and the checkpoint to resume), else the panic's own message.
//!
//! Named threads are left to their owners: the main thread and test threads unwind to their
//! callers, and cubecl's device threads (`DSU-…`, `DSD-…`) catch their tasks' panics and hand
//! the failure to the read that needs it. A training run turns such a failure into its error
//! (`trainer::gpu_failure`); `decision score` and `decision eval` do so through
//! [`explaining_gpu_failures`].

use std::sync::{Mutex, Once};

type Explain = Box<dyn Fn(&str) -> String + Send + Sync>;

static EXPLAIN: Mutex<Option<Explain>> = Mutex::new(None);
static INSTALL: Once = Once::new();

/// The status a runtime thread's failure ends the process with: `decision`'s status for errors.
pub(crate) const EXIT_STATUS: i32 = 2;

/// From now on, a panic on an unnamed thread ends the process with an error saying why. Once per
/// process; later calls do nothing.
///
/// While an explanation is in place ([`explain_with`]: a training run), a panic that will be
/// explained is not also reported raw (`thread '…' panicked at …`, a source path inside the
/// runtime), unless `RUST_BACKTRACE` asks for that report: an unnamed thread's, explained here,
/// and a GPU failure on a named thread ([`GpuFailure`]), which reaches the run that catches it.
/// Any other panic keeps its usual report.
///
/// [`GpuFailure`]: crate::model::backend::GpuFailure
pub(crate) fn install() {
    INSTALL.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let payload = info.payload();
            let message = payload
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| payload.downcast_ref::<&str>().copied())
                .unwrap_or("a thread of the GPU runtime panicked");
            let unnamed = std::thread::current().name().is_none();
            let explaining = EXPLAIN.lock().is_ok_and(|explain| explain.is_some());
            let explained_later =
                explaining && (unnamed || crate::model::backend::GpuFailure::of(message).is_some());
            if !explained_later || std::env::var_os("RUST_BACKTRACE").is_some() {
                previous(info);
            }
            if !unnamed {
                return;
            }
            let explained = EXPLAIN
                .lock()
                .ok()
                .and_then(|explain| explain.as_ref().map(|f| f(message)));
            eprintln!(
                "error: {}",
                explained.unwrap_or_else(|| format!(
                    "a thread of the GPU runtime failed, and the work waiting on the device \
                     cannot go on: {}",
                    message.trim()
                ))
            );
            std::process::exit(EXIT_STATUS);
        }));
    });
}

/// Until the returned guard drops, a runtime thread's failure is told by `explain`, given the
/// panic's message.
pub(crate) fn explain_with(explain: impl Fn(&str) -> String + Send + Sync + 'static) -> Explaining {
    set(Some(Box::new(explain)));
    Explaining(())
}

fn set(explain: Option<Explain>) {
    match EXPLAIN.lock() {
        Ok(mut slot) => *slot = explain,
        Err(poisoned) => *poisoned.into_inner() = explain,
    }
}

/// Keeps [`explain_with`]'s explanation in place.
#[must_use = "the explanation lasts as long as the guard"]
pub(crate) struct Explaining(());

impl Drop for Explaining {
    fn drop(&mut self) {
        set(None);
    }
}

/// `work`, scoring with `model` in batches of `batch_size`, where a failure of the GPU runtime
/// (which panics: memory exhausted, a lost device, a kernel it cannot run) becomes an error that
/// says which, on what adapter, and what to change. On the CPU, and for any other panic, `work`
/// runs as it is.
pub(crate) fn explaining_gpu_failures<T>(
    model: &crate::model::qwen3::Qwen3,
    batch_size: usize,
    work: impl FnOnce() -> T,
) -> anyhow::Result<T> {
    if model.device() == burn::tensor::Device::flex() {
        return Ok(work());
    }
    let dtype = format!("{:?}", model.dtype()).to_lowercase();
    explaining_gpu_failures_in(&dtype, batch_size, work)
}

/// [`explaining_gpu_failures`] on a GPU, for a model in `dtype`.
fn explaining_gpu_failures_in<T>(
    dtype: &str,
    batch_size: usize,
    work: impl FnOnce() -> T,
) -> anyhow::Result<T> {
    use crate::model::backend::{GpuFailure, panic_text, wgpu_adapter};
    let on = wgpu_adapter().map_or_else(String::new, |a| format!(" ({})", a.short()));
    let dtype = dtype.to_string();
    let explain = move |failure: Option<GpuFailure>, message: &str| {
        let what = match failure {
            Some(GpuFailure::OutOfMemory) => format!(
                "the GPU{on} ran out of memory scoring batches of up to {batch_size} rows; lower \
                 --batch-size, or score with --backend cpu"
            ),
            Some(GpuFailure::DeviceLost) => format!(
                "the GPU{on} was lost (a driver reset, a hang or a fault) while scoring; check the \
                 driver's log; a smaller --batch-size (now {batch_size}) shortens each kernel"
            ),
            Some(GpuFailure::Kernel) => format!(
                "the GPU{on} could not compile or run a scoring kernel in {dtype}; try --dtype \
                 f32, or --backend cpu"
            ),
            None => format!("a thread of the GPU{on}'s runtime failed while scoring"),
        };
        format!("{what}. The runtime said: {}", message.trim())
    };
    let _explaining = {
        let explain = explain.clone();
        crate::model::gpu_watch::explain_with(move |m| explain(GpuFailure::of(m), m))
    };
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)) {
        Ok(result) => Ok(result),
        Err(panic) => {
            let message = panic_text(&panic);
            match GpuFailure::of(&message) {
                Some(failure) => Err(anyhow::anyhow!(explain(Some(failure), &message))),
                None => std::panic::resume_unwind(panic),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHILD: &str = "DECISION_GPU_WATCH_CHILD";

    /// The explanation is one for the process: tests that set it take turns.
    fn one_explanation_at_a_time() -> std::sync::MutexGuard<'static, ()> {
        static TURN: Mutex<()> = Mutex::new(());
        TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Run in a child process of this test binary (the watch ends its process): a named thread's
    /// panic is left to the thread that joins it; an unnamed thread's ends the process with the
    /// explanation in place, while the main thread waits as a run waits on a dead device.
    #[test]
    fn a_panic_on_a_runtime_thread_ends_the_process_with_its_explanation() {
        let test = "model::gpu_watch::tests::a_panic_on_a_runtime_thread_ends_the_process_with_its_explanation";
        if std::env::var_os(CHILD).is_some() {
            install();
            let _explaining = explain_with(|m| format!("explained: {m}"));
            let named = std::thread::Builder::new()
                .name("DSD-0-0".into())
                .spawn(|| panic!("a device task's panic"))
                .unwrap()
                .join();
            assert!(named.is_err());
            println!("the named thread's panic was left to its owner");
            let failed_run = std::thread::Builder::new()
                .name("run".into())
                .spawn(|| panic!("can't allocate buffer of size: 622329856"))
                .unwrap()
                .join();
            assert!(failed_run.is_err());
            std::thread::spawn(|| {
                panic!("Could not lock adapter context. This is most-likely a deadlock.")
            });
            std::thread::sleep(std::time::Duration::from_secs(60));
            println!("still waiting after 60 s");
            return;
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([test, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD, "1")
            .env_remove("RUST_BACKTRACE")
            .output()
            .unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert_eq!(
            out.status.code(),
            Some(EXIT_STATUS),
            "stdout:\n{stdout}\nstderr:\n{stderr}"
        );
        assert!(stdout.contains("the named thread's panic was left to its owner"));
        assert!(!stdout.contains("still waiting"));
        assert!(
            stderr.contains(
                "error: explained: Could not lock adapter context. This is most-likely a deadlock."
            ),
            "{stderr}"
        );
        // Reported raw: the device task's panic, which nothing here explains. Not: the GPU
        // failure that the run explains, nor the unnamed thread's, explained above.
        assert!(stderr.contains("thread 'DSD-0-0'"), "{stderr}");
        assert!(!stderr.contains("thread 'run'"), "{stderr}");
        assert!(!stderr.contains("thread '<unnamed>'"), "{stderr}");
    }

    #[test]
    fn the_explanation_lasts_as_long_as_its_guard() {
        let _one = one_explanation_at_a_time();
        let told = |m: &str| EXPLAIN.lock().unwrap().as_ref().map(|f| f(m));
        {
            let _explaining = explain_with(|m| format!("run: {m}"));
            assert_eq!(told("lost").as_deref(), Some("run: lost"));
        }
        assert_eq!(told("lost"), None);
    }

    /// A GPU runtime's failure while scoring is an error naming it and what to change; any other
    /// panic stays a panic.
    #[test]
    fn a_gpu_failure_while_scoring_says_what_to_change() {
        let _one = one_explanation_at_a_time();
        let e = explaining_gpu_failures_in("f16", 32, || -> usize {
            panic!("can't allocate buffer of size: 622329856")
        })
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("ran out of memory scoring batches of up to 32 rows; lower --batch-size"),
            "{e}"
        );
        assert!(e.ends_with("The runtime said: can't allocate buffer of size: 622329856"));
        let e = explaining_gpu_failures_in("f16", 32, || -> usize { panic!("SPIR-V compile") })
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("a scoring kernel in f16; try --dtype f32"),
            "{e}"
        );
        assert_eq!(
            explaining_gpu_failures_in("f16", 32, || 7).unwrap(),
            7,
            "no failure, the answer"
        );
        let other = std::panic::catch_unwind(|| {
            explaining_gpu_failures_in("f16", 32, || -> usize { panic!("index out of bounds") })
        });
        assert!(other.is_err(), "not a GPU failure: the panic goes on");
    }
}
