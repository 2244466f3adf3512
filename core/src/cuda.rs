//! The CUDA runtime that libtorch loaded, for what `tch` does not expose: side streams
//! and events for copies that overlap compute (staging buffers to the device, published
//! parameters off it), timing events for the learner's stall accounting, and device
//! memory figures for errors. [`compute_stream`] names the stream the updates run on.
//!
//! The runtime is found among the libraries already loaded (`RTLD_NOLOAD`: the same
//! runtime, the same contexts as libtorch), whatever its soname's version. Every call
//! selects its device for the calling thread and restores the thread's previous device
//! afterwards, so nothing here changes which device PyTorch's own calls on that thread
//! use.
//!
//! Side-stream copies, per staging buffer:
//! - sampler thread: wait for the buffer's previous copy (`copied`, host side) before
//!   refilling its pinned memory; make the copy stream wait for the learner's last use
//!   of the buffer's device twin (`used`, device side); queue the copies on the copy
//!   stream and record `copied` there;
//! - learner thread: make the compute stream ([`compute_stream`]) wait for `copied`
//!   (device side, no host sync), run the update, record `used` on the compute stream.
//!
//! Published parameters leave the device the other way (`crate::publisher`): the
//! learner thread snapshots them on the compute stream and records an event after the
//! snapshot; the publisher thread makes its own stream wait for that event, copies the
//! snapshot to pinned memory there and waits for the copy, on its own thread.
//!
//! Nothing here blocks the learner thread. Staging copies on a side stream are off
//! unless asked for (`--copy-stream`); the tests that exercise the streams are ignored
//! without CUDA and run by the GPU script.

use std::ffi::{c_void, CStr};
use std::sync::{Arc, OnceLock};

type Stream = *mut c_void;
type Event = *mut c_void;
type Status = i32;

const STREAM_NON_BLOCKING: u32 = 0x1;
/// Host waits sleep instead of spinning a core; no timing.
const EVENT_BLOCKING_SYNC_NO_TIMING: u32 = 0x1 | 0x2;
/// Host waits sleep; with timing (for elapsed-time queries).
const EVENT_BLOCKING_SYNC: u32 = 0x1;
const MEMCPY_HOST_TO_DEVICE: i32 = 1;
const MEMCPY_DEVICE_TO_HOST: i32 = 2;
/// PyTorch's default stream: the legacy default stream.
const LEGACY_STREAM: Stream = std::ptr::null_mut();

/// The stream the learner's updates run on, and the one place that says which:
/// PyTorch's default stream (the legacy stream) today. Capturing the update as a CUDA
/// graph moves compute to a stream of its own; every event recorded on, and every
/// wait of, the compute stream here goes through this.
fn compute_stream() -> Stream {
    LEGACY_STREAM
}

type SetDevice = unsafe extern "C" fn(i32) -> Status;
type GetDevice = unsafe extern "C" fn(*mut i32) -> Status;
type StreamCreate = unsafe extern "C" fn(*mut Stream, u32) -> Status;
type EventCreate = unsafe extern "C" fn(*mut Event, u32) -> Status;
type MemcpyAsync = unsafe extern "C" fn(*mut c_void, *const c_void, usize, i32, Stream) -> Status;
type EventRecord = unsafe extern "C" fn(Event, Stream) -> Status;
type StreamWaitEvent = unsafe extern "C" fn(Stream, Event, u32) -> Status;
type EventSynchronize = unsafe extern "C" fn(Event) -> Status;
type EventElapsedTime = unsafe extern "C" fn(*mut f32, Event, Event) -> Status;
type StreamSynchronize = unsafe extern "C" fn(Stream) -> Status;
type EventDestroy = unsafe extern "C" fn(Event) -> Status;
type StreamDestroy = unsafe extern "C" fn(Stream) -> Status;
type MemGetInfo = unsafe extern "C" fn(*mut usize, *mut usize) -> Status;
type GetLastError = unsafe extern "C" fn() -> Status;

/// The CUDA runtime entry points used here.
struct Runtime {
    soname: &'static str,
    set_device: SetDevice,
    get_device: GetDevice,
    stream_create: StreamCreate,
    event_create: EventCreate,
    memcpy_async: MemcpyAsync,
    event_record: EventRecord,
    stream_wait_event: StreamWaitEvent,
    event_synchronize: EventSynchronize,
    event_elapsed_time: EventElapsedTime,
    stream_synchronize: StreamSynchronize,
    event_destroy: EventDestroy,
    stream_destroy: StreamDestroy,
    mem_get_info: MemGetInfo,
    get_last_error: GetLastError,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum CopyStreamError {
    #[error("no CUDA runtime is loaded (looked for {}): is this a CUDA build of libtorch on a GPU host?", CUDART_SONAMES.join(", "))]
    NoRuntime,
    #[error("the CUDA runtime has no {0}")]
    Missing(&'static str),
    #[error("{what} failed with CUDA error {status}")]
    Cuda { what: &'static str, status: Status },
    #[error("cannot start the sampler thread: {0}")]
    Thread(String),
}

/// The CUDA runtime sonames libtorch builds link, newest first.
const CUDART_SONAMES: [&str; 4] = [
    "libcudart.so.13",
    "libcudart.so.12",
    "libcudart.so.11.0",
    "libcudart.so",
];

/// `status` as a result. A failed (or not-ready: `cudaErrorNotReady`, 600, for an
/// event read early) call leaves the runtime's last error
/// set on this thread, and PyTorch checks that error after its own calls: left there,
/// it would surface later from an unrelated PyTorch operation. Every failure here is
/// handled by the caller, so it is cleared at once.
fn check(what: &'static str, status: Status) -> Result<(), CopyStreamError> {
    if status == 0 {
        return Ok(());
    }
    clear_last_error();
    Err(CopyStreamError::Cuda { what, status })
}

/// Resets the calling thread's last CUDA runtime error (a no-op without a runtime).
fn clear_last_error() {
    if let Ok(rt) = Runtime::get() {
        // SAFETY: no arguments; returns and resets the thread's last error.
        let _ = unsafe { (rt.get_last_error)() };
    }
}

/// The last CUDA runtime error of this thread, reset by reading it (0: none).
pub fn take_last_error() -> Result<Status, CopyStreamError> {
    let rt = Runtime::get()?;
    // SAFETY: as in `clear_last_error`.
    Ok(unsafe { (rt.get_last_error)() })
}

impl Runtime {
    /// The runtime loaded in this process, looked up once.
    fn get() -> Result<&'static Runtime, CopyStreamError> {
        static RUNTIME: OnceLock<Result<Runtime, CopyStreamError>> = OnceLock::new();
        RUNTIME
            .get_or_init(Runtime::load)
            .as_ref()
            .map_err(Clone::clone)
    }

    fn load() -> Result<Self, CopyStreamError> {
        let (soname, handle) = CUDART_SONAMES
            .iter()
            .find_map(|name| {
                let c = std::ffi::CString::new(*name).ok()?;
                // SAFETY: dlopen with RTLD_NOLOAD only looks up an already-loaded library;
                // the handle is never closed, so the symbols stay valid for the process.
                let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
                (!h.is_null()).then_some((*name, h))
            })
            .ok_or(CopyStreamError::NoRuntime)?;
        let sym = |name: &'static CStr| {
            // SAFETY: `handle` is a live library handle and `name` is NUL-terminated.
            let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
            if p.is_null() {
                Err(CopyStreamError::Missing(
                    name.to_str().unwrap_or("a required symbol"),
                ))
            } else {
                Ok(p)
            }
        };
        // SAFETY: each symbol is the CUDA runtime function of that name, whose C
        // signature the target type spells out (stable across CUDA 11-13).
        unsafe {
            use std::mem::transmute;
            Ok(Self {
                soname,
                set_device: transmute::<*mut c_void, SetDevice>(sym(c"cudaSetDevice")?),
                get_device: transmute::<*mut c_void, GetDevice>(sym(c"cudaGetDevice")?),
                stream_create: transmute::<*mut c_void, StreamCreate>(sym(
                    c"cudaStreamCreateWithFlags",
                )?),
                event_create: transmute::<*mut c_void, EventCreate>(sym(
                    c"cudaEventCreateWithFlags",
                )?),
                memcpy_async: transmute::<*mut c_void, MemcpyAsync>(sym(c"cudaMemcpyAsync")?),
                event_record: transmute::<*mut c_void, EventRecord>(sym(c"cudaEventRecord")?),
                stream_wait_event: transmute::<*mut c_void, StreamWaitEvent>(sym(
                    c"cudaStreamWaitEvent",
                )?),
                event_synchronize: transmute::<*mut c_void, EventSynchronize>(sym(
                    c"cudaEventSynchronize",
                )?),
                event_elapsed_time: transmute::<*mut c_void, EventElapsedTime>(sym(
                    c"cudaEventElapsedTime",
                )?),
                stream_synchronize: transmute::<*mut c_void, StreamSynchronize>(sym(
                    c"cudaStreamSynchronize",
                )?),
                event_destroy: transmute::<*mut c_void, EventDestroy>(sym(c"cudaEventDestroy")?),
                stream_destroy: transmute::<*mut c_void, StreamDestroy>(sym(c"cudaStreamDestroy")?),
                mem_get_info: transmute::<*mut c_void, MemGetInfo>(sym(c"cudaMemGetInfo")?),
                get_last_error: transmute::<*mut c_void, GetLastError>(sym(c"cudaGetLastError")?),
            })
        }
    }

    /// Runs `f` with `device` current on this thread, then makes the thread's previous
    /// device current again.
    fn on<T>(
        &self,
        device: i32,
        f: impl FnOnce() -> Result<T, CopyStreamError>,
    ) -> Result<T, CopyStreamError> {
        let mut previous = -1;
        // SAFETY: a valid out-pointer.
        check("cudaGetDevice", unsafe { (self.get_device)(&mut previous) })?;
        if previous != device {
            // SAFETY: plain runtime call; the index is checked by the runtime.
            check("cudaSetDevice", unsafe { (self.set_device)(device) })?;
        }
        let out = f();
        if previous != device && previous >= 0 {
            // SAFETY: as above; restores what the thread had.
            unsafe { (self.set_device)(previous) };
        }
        out
    }
}

/// The soname of the CUDA runtime libtorch loaded, if any (for `learner doctor`).
pub fn runtime_soname() -> Result<&'static str, CopyStreamError> {
    Runtime::get().map(|rt| rt.soname)
}

/// `(free, total)` bytes of device memory on `device`.
pub fn memory(device: usize) -> Result<(usize, usize), CopyStreamError> {
    let rt = Runtime::get()?;
    rt.on(device as i32, || {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: valid out-pointers.
        check("cudaMemGetInfo", unsafe {
            (rt.mem_get_info)(&mut free, &mut total)
        })?;
        Ok((free, total))
    })
}

/// A pair of timing events around work queued on PyTorch's compute stream, read
/// without waiting once that work is known to be done (the learner waits for the
/// device once per half ring of staging buffers anyway).
#[derive(Debug)]
pub struct Stopwatch {
    start: TimingEvent,
    end: TimingEvent,
}

#[derive(Debug)]
struct TimingEvent {
    event: Event,
    device: i32,
}

// SAFETY: CUDA events may be used from any host thread (see `CopyStream`).
unsafe impl Send for TimingEvent {}

impl Drop for TimingEvent {
    fn drop(&mut self) {
        if let Ok(rt) = Runtime::get() {
            let event = self.event;
            // SAFETY: a live event, destroyed once.
            let _ = rt.on(self.device, || {
                check("cudaEventDestroy", unsafe { (rt.event_destroy)(event) })
            });
        }
    }
}

impl Stopwatch {
    pub fn new(device: usize) -> Result<Self, CopyStreamError> {
        let rt = Runtime::get()?;
        let device = device as i32;
        let make = || {
            rt.on(device, || {
                let mut event: Event = std::ptr::null_mut();
                // SAFETY: valid out-pointer.
                check("cudaEventCreateWithFlags", unsafe {
                    (rt.event_create)(&mut event, EVENT_BLOCKING_SYNC)
                })?;
                Ok(TimingEvent { event, device })
            })
        };
        Ok(Self {
            start: make()?,
            end: make()?,
        })
    }

    fn record(&self, e: &TimingEvent) -> Result<(), CopyStreamError> {
        let rt = Runtime::get()?;
        rt.on(self.start.device, || {
            // SAFETY: live event; the compute stream always exists.
            check("cudaEventRecord", unsafe {
                (rt.event_record)(e.event, compute_stream())
            })
        })
    }

    /// Marks the start, on the compute stream, of the work to time.
    pub fn start(&self) -> Result<(), CopyStreamError> {
        self.record(&self.start)
    }

    /// Marks its end.
    pub fn stop(&self) -> Result<(), CopyStreamError> {
        self.record(&self.end)
    }

    /// Seconds between start and stop, once both have completed on the device; `None`
    /// if they have not yet (never waits).
    pub fn elapsed_s(&self) -> Option<f64> {
        let rt = Runtime::get().ok()?;
        rt.on(self.start.device, || {
            let mut ms = 0.0f32;
            // SAFETY: live events and a valid out-pointer. Not ready yet is an error
            // status like any other, cleared by `check`: `None` either way.
            check("cudaEventElapsedTime", unsafe {
                (rt.event_elapsed_time)(&mut ms, self.start.event, self.end.event)
            })?;
            Ok(f64::from(ms) * 1e-3)
        })
        .ok()
    }
}

/// An event on PyTorch's compute stream marking where queued work ends, for reading
/// back the results of asynchronous device-to-host copies once they are done.
#[derive(Debug)]
pub struct Marker(TimingEvent);

impl Marker {
    pub fn new(device: usize) -> Result<Self, CopyStreamError> {
        let rt = Runtime::get()?;
        let device = device as i32;
        rt.on(device, || {
            let mut event: Event = std::ptr::null_mut();
            // SAFETY: valid out-pointer.
            check("cudaEventCreateWithFlags", unsafe {
                (rt.event_create)(&mut event, EVENT_BLOCKING_SYNC)
            })?;
            Ok(Self(TimingEvent { event, device }))
        })
    }

    /// Marks the end of the work queued so far on the compute stream.
    pub fn record(&self) -> Result<(), CopyStreamError> {
        let rt = Runtime::get()?;
        let event = self.0.event;
        rt.on(self.0.device, || {
            // SAFETY: live event; the compute stream always exists.
            check("cudaEventRecord", unsafe {
                (rt.event_record)(event, compute_stream())
            })
        })
    }

    /// Waits on the host until the marked work is done (at once if it already is).
    pub fn wait(&self) -> Result<(), CopyStreamError> {
        let rt = Runtime::get()?;
        let event = self.0.event;
        rt.on(self.0.device, || {
            // SAFETY: live event.
            check("cudaEventSynchronize", unsafe {
                (rt.event_synchronize)(event)
            })
        })
    }
}

/// A non-blocking CUDA stream for copies to and from one device: it never waits for
/// the compute stream unless told to ([`CudaEvent::copy_stream_waits`]), and the
/// compute stream never waits for it unless told to.
pub struct CopyStream {
    rt: &'static Runtime,
    stream: Stream,
    device: i32,
}

// SAFETY: CUDA streams and events may be used from any host thread; every call
// selects the stream's device for the calling thread (and restores the previous one).
unsafe impl Send for CopyStream {}
// SAFETY: as above; the runtime API is thread-safe.
unsafe impl Sync for CopyStream {}

impl std::fmt::Debug for CopyStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CopyStream")
            .field("device", &self.device)
            .finish_non_exhaustive()
    }
}

impl CopyStream {
    pub fn new(device: usize) -> Result<Arc<Self>, CopyStreamError> {
        let rt = Runtime::get()?;
        let device = device as i32;
        let stream = rt.on(device, || {
            let mut stream: Stream = std::ptr::null_mut();
            // SAFETY: valid out-pointer; the device index is checked by the runtime.
            check("cudaStreamCreateWithFlags", unsafe {
                (rt.stream_create)(&mut stream, STREAM_NON_BLOCKING)
            })?;
            Ok(stream)
        })?;
        Ok(Arc::new(Self { rt, stream, device }))
    }

    /// Runs a runtime call with this stream's device current (see [`Runtime::on`]).
    fn on_device<T>(
        &self,
        f: impl FnOnce() -> Result<T, CopyStreamError>,
    ) -> Result<T, CopyStreamError> {
        self.rt.on(self.device, f)
    }

    /// A new event (timing disabled) on this stream's device.
    pub fn event(self: &Arc<Self>) -> Result<CudaEvent, CopyStreamError> {
        let rt = self.rt;
        let event = self.on_device(|| {
            let mut event: Event = std::ptr::null_mut();
            // SAFETY: valid out-pointer.
            check("cudaEventCreateWithFlags", unsafe {
                (rt.event_create)(&mut event, EVENT_BLOCKING_SYNC_NO_TIMING)
            })?;
            Ok(event)
        })?;
        Ok(CudaEvent {
            owner: Arc::clone(self),
            event,
        })
    }

    /// Queues a copy of `bytes` bytes from pinned host memory to device memory.
    ///
    /// # Safety
    /// `src` must be page-locked host memory and `dst` device memory of this stream's
    /// device, both at least `bytes` long, and both must stay valid and untouched by
    /// anything else until the copy has completed (see [`CudaEvent`]).
    pub unsafe fn copy(
        &self,
        dst: *mut c_void,
        src: *const c_void,
        bytes: usize,
    ) -> Result<(), CopyStreamError> {
        // SAFETY: per the function contract.
        unsafe { self.queue_copy(dst, src, bytes, MEMCPY_HOST_TO_DEVICE) }
    }

    /// Queues a copy of `bytes` bytes from device memory to pinned host memory.
    ///
    /// # Safety
    /// `src` must be device memory of this stream's device and `dst` page-locked host
    /// memory, both at least `bytes` long; `src` must hold its final values by the time
    /// the stream reaches the copy (make the stream wait for the event recorded after
    /// the work that writes it), and both must stay valid, `dst` untouched, until the
    /// copy has completed.
    pub unsafe fn copy_to_host(
        &self,
        dst: *mut c_void,
        src: *const c_void,
        bytes: usize,
    ) -> Result<(), CopyStreamError> {
        // SAFETY: per the function contract.
        unsafe { self.queue_copy(dst, src, bytes, MEMCPY_DEVICE_TO_HOST) }
    }

    /// `cudaMemcpyAsync` of `kind` on this stream.
    ///
    /// # Safety
    /// As [`Self::copy`] or [`Self::copy_to_host`] for that direction.
    unsafe fn queue_copy(
        &self,
        dst: *mut c_void,
        src: *const c_void,
        bytes: usize,
        kind: i32,
    ) -> Result<(), CopyStreamError> {
        let (rt, stream) = (self.rt, self.stream);
        self.on_device(|| {
            // SAFETY: per the caller's contract.
            check("cudaMemcpyAsync", unsafe {
                (rt.memcpy_async)(dst, src, bytes, kind, stream)
            })
        })
    }

    /// Waits on the host until every copy queued so far has completed.
    pub fn synchronize(&self) -> Result<(), CopyStreamError> {
        let (rt, stream) = (self.rt, self.stream);
        self.on_device(|| {
            // SAFETY: a live stream.
            check("cudaStreamSynchronize", unsafe {
                (rt.stream_synchronize)(stream)
            })
        })
    }
}

impl Drop for CopyStream {
    fn drop(&mut self) {
        // Queued copies complete first; the stream handle is released after them.
        let _ = self.synchronize();
        let (rt, stream) = (self.rt, self.stream);
        // SAFETY: a live stream, used by nothing once its last owner is gone.
        let _ =
            self.on_device(|| check("cudaStreamDestroy", unsafe { (rt.stream_destroy)(stream) }));
    }
}

/// A CUDA event of a [`CopyStream`]'s device.
pub struct CudaEvent {
    owner: Arc<CopyStream>,
    event: Event,
}

// SAFETY: see `CopyStream`.
unsafe impl Send for CudaEvent {}

impl std::fmt::Debug for CudaEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaEvent").finish_non_exhaustive()
    }
}

impl Drop for CudaEvent {
    fn drop(&mut self) {
        let (rt, event) = (self.owner.rt, self.event);
        // SAFETY: a live event; destroying one with work pending is allowed (the
        // runtime releases it once that work completes).
        let _ = self
            .owner
            .on_device(|| check("cudaEventDestroy", unsafe { (rt.event_destroy)(event) }));
    }
}

impl CudaEvent {
    fn call(
        &self,
        what: &'static str,
        f: impl FnOnce(&Runtime) -> Status,
    ) -> Result<(), CopyStreamError> {
        let rt = self.owner.rt;
        self.owner.on_device(|| check(what, f(rt)))
    }

    /// Records the event after the work queued so far on the copy stream.
    pub fn record_on_copy_stream(&self) -> Result<(), CopyStreamError> {
        let (event, stream) = (self.event, self.owner.stream);
        // SAFETY: live event and stream.
        self.call("cudaEventRecord", |rt| unsafe {
            (rt.event_record)(event, stream)
        })
    }

    /// Records the event after the work queued so far on the compute stream.
    pub fn record_on_compute_stream(&self) -> Result<(), CopyStreamError> {
        let event = self.event;
        // SAFETY: live event; the compute stream always exists.
        self.call("cudaEventRecord", |rt| unsafe {
            (rt.event_record)(event, compute_stream())
        })
    }

    /// Makes the compute stream wait (on the device) for this event.
    pub fn compute_stream_waits(&self) -> Result<(), CopyStreamError> {
        let event = self.event;
        // SAFETY: live event; the compute stream always exists.
        self.call("cudaStreamWaitEvent", |rt| unsafe {
            (rt.stream_wait_event)(compute_stream(), event, 0)
        })
    }

    /// Makes the copy stream wait (on the device) for this event.
    pub fn copy_stream_waits(&self) -> Result<(), CopyStreamError> {
        let (event, stream) = (self.event, self.owner.stream);
        // SAFETY: live event and stream.
        self.call("cudaStreamWaitEvent", |rt| unsafe {
            (rt.stream_wait_event)(stream, event, 0)
        })
    }

    /// Waits on the host for the event (immediately if it was never recorded).
    pub fn synchronize(&self) -> Result<(), CopyStreamError> {
        let event = self.event;
        // SAFETY: live event.
        self.call("cudaEventSynchronize", |rt| unsafe {
            (rt.event_synchronize)(event)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_and_timing_events_or_a_clear_error_without_a_gpu() {
        if tch::Cuda::is_available() {
            let stream = CopyStream::new(0).expect("a side stream on a GPU host");
            stream.event().expect("an event").synchronize().unwrap();
            let watch = Stopwatch::new(0).unwrap();
            watch.start().unwrap();
            // Work that is still running when the stopwatch is read: not ready, and
            // the runtime's last error is left clear for PyTorch.
            let x = tch::Tensor::randn([4096, 4096], (tch::Kind::Float, tch::Device::Cuda(0)));
            for _ in 0..8 {
                let _ = x.matmul(&x);
            }
            watch.stop().unwrap();
            let early = watch.elapsed_s();
            assert_eq!(take_last_error().unwrap(), 0, "read early: {early:?}");
            tch::Cuda::synchronize(0);
            assert!(watch.elapsed_s().is_some_and(|s| s >= 0.0));
            let (free, total) = memory(0).unwrap();
            assert!(free <= total && total > 0);
            return;
        }
        // libtorch_cuda (and so the CUDA runtime) is linked even on CPU-only hosts:
        // the runtime's own "no device" error comes back, not a panic.
        let err = CopyStream::new(0).unwrap_err();
        eprintln!("without a GPU: {err}");
        // (A missing driver is an initialisation error: it stays for the process, and
        // PyTorch reports CUDA as unavailable; the GPU branch above checks that a
        // handled error is not left behind.)
        assert!(
            matches!(
                err,
                CopyStreamError::Cuda { .. } | CopyStreamError::NoRuntime
            ),
            "{err}"
        );
    }
}
