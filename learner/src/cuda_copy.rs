//! Host-to-device copies on a side CUDA stream, so that the next batch crosses PCIe
//! while the current update computes.
//!
//! `tch` exposes no CUDA streams or events, so this calls the CUDA runtime that libtorch
//! itself loaded (`libcudart.so.13`, found with `RTLD_NOLOAD`: the same runtime, the
//! same contexts). The protocol, per staging slot:
//! - sampler thread: wait for the slot's previous copy (`copied`, host side) before
//!   refilling its pinned memory; make the copy stream wait for the learner's last use
//!   of the slot's device buffers (`used`, device side); queue the copies on the copy
//!   stream and record `copied` there;
//! - learner thread: make the compute stream (PyTorch's default, the legacy stream
//!   handle 0) wait for `copied` (device side, no host sync), run the update, record
//!   `used` on the compute stream.
//!
//! Nothing here blocks the learner thread. Off unless asked for (`--copy-stream`), and
//! **not yet run on a GPU**: the tests that exercise it skip themselves without CUDA.

use std::ffi::{c_void, CStr};
use std::sync::Arc;

type Stream = *mut c_void;
type Event = *mut c_void;
type Status = i32;

const STREAM_NON_BLOCKING: u32 = 0x1;
/// Host waits sleep instead of spinning a core; no timing.
const EVENT_BLOCKING_SYNC_NO_TIMING: u32 = 0x1 | 0x2;
const MEMCPY_HOST_TO_DEVICE: i32 = 1;
/// PyTorch's default stream: the legacy default stream.
const LEGACY_STREAM: Stream = std::ptr::null_mut();

type SetDevice = unsafe extern "C" fn(i32) -> Status;
type StreamCreate = unsafe extern "C" fn(*mut Stream, u32) -> Status;
type EventCreate = unsafe extern "C" fn(*mut Event, u32) -> Status;
type MemcpyAsync = unsafe extern "C" fn(*mut c_void, *const c_void, usize, i32, Stream) -> Status;
type EventRecord = unsafe extern "C" fn(Event, Stream) -> Status;
type StreamWaitEvent = unsafe extern "C" fn(Stream, Event, u32) -> Status;
type EventSynchronize = unsafe extern "C" fn(Event) -> Status;
type StreamSynchronize = unsafe extern "C" fn(Stream) -> Status;
type EventDestroy = unsafe extern "C" fn(Event) -> Status;
type StreamDestroy = unsafe extern "C" fn(Stream) -> Status;

/// The CUDA runtime entry points used here.
struct Runtime {
    set_device: SetDevice,
    stream_create: StreamCreate,
    event_create: EventCreate,
    memcpy_async: MemcpyAsync,
    event_record: EventRecord,
    stream_wait_event: StreamWaitEvent,
    event_synchronize: EventSynchronize,
    stream_synchronize: StreamSynchronize,
    event_destroy: EventDestroy,
    stream_destroy: StreamDestroy,
}

#[derive(Debug, thiserror::Error)]
pub enum CopyStreamError {
    #[error("the CUDA runtime (libcudart.so.13) is not loaded: is this a CUDA build of libtorch on a GPU host?")]
    NoRuntime,
    #[error("the CUDA runtime has no {0}")]
    Missing(&'static str),
    #[error("{what} failed with CUDA error {status}")]
    Cuda { what: &'static str, status: Status },
    #[error("cannot start the sampler thread: {0}")]
    Thread(String),
}

fn check(what: &'static str, status: Status) -> Result<(), CopyStreamError> {
    if status == 0 {
        Ok(())
    } else {
        Err(CopyStreamError::Cuda { what, status })
    }
}

impl Runtime {
    fn load() -> Result<Self, CopyStreamError> {
        // SAFETY: dlopen with RTLD_NOLOAD only looks up an already-loaded library; the
        // handle is never closed, so the symbols stay valid for the process's life.
        let handle = unsafe {
            libc::dlopen(
                c"libcudart.so.13".as_ptr(),
                libc::RTLD_NOW | libc::RTLD_NOLOAD,
            )
        };
        if handle.is_null() {
            return Err(CopyStreamError::NoRuntime);
        }
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
        // signature the target type spells out (CUDA 13 runtime API).
        unsafe {
            use std::mem::transmute;
            Ok(Self {
                set_device: transmute::<*mut c_void, SetDevice>(sym(c"cudaSetDevice")?),
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
                stream_synchronize: transmute::<*mut c_void, StreamSynchronize>(sym(
                    c"cudaStreamSynchronize",
                )?),
                event_destroy: transmute::<*mut c_void, EventDestroy>(sym(c"cudaEventDestroy")?),
                stream_destroy: transmute::<*mut c_void, StreamDestroy>(sym(c"cudaStreamDestroy")?),
            })
        }
    }
}

/// A non-blocking CUDA stream for copies to one device.
pub struct CopyStream {
    rt: Runtime,
    stream: Stream,
    device: i32,
}

// SAFETY: CUDA streams and events may be used from any host thread; every call first
// selects the stream's device for the calling thread.
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
        let rt = Runtime::load()?;
        let device = device as i32;
        let mut stream: Stream = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the device index is checked by the runtime.
        unsafe {
            check("cudaSetDevice", (rt.set_device)(device))?;
            check(
                "cudaStreamCreateWithFlags",
                (rt.stream_create)(&mut stream, STREAM_NON_BLOCKING),
            )?;
        }
        Ok(Arc::new(Self { rt, stream, device }))
    }

    fn on_device(&self) -> Result<(), CopyStreamError> {
        // SAFETY: plain runtime call.
        check("cudaSetDevice", unsafe {
            (self.rt.set_device)(self.device)
        })
    }

    /// A new event (timing disabled) on this stream's device.
    pub fn event(self: &Arc<Self>) -> Result<CudaEvent, CopyStreamError> {
        self.on_device()?;
        let mut event: Event = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        check("cudaEventCreateWithFlags", unsafe {
            (self.rt.event_create)(&mut event, EVENT_BLOCKING_SYNC_NO_TIMING)
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
        self.on_device()?;
        // SAFETY: per the function contract.
        check("cudaMemcpyAsync", unsafe {
            (self.rt.memcpy_async)(dst, src, bytes, MEMCPY_HOST_TO_DEVICE, self.stream)
        })
    }

    /// Waits on the host until every copy queued so far has completed.
    pub fn synchronize(&self) -> Result<(), CopyStreamError> {
        self.on_device()?;
        // SAFETY: a live stream.
        check("cudaStreamSynchronize", unsafe {
            (self.rt.stream_synchronize)(self.stream)
        })
    }
}

impl Drop for CopyStream {
    fn drop(&mut self) {
        // Queued copies complete first; the stream handle is released after them.
        let _ = self.synchronize();
        // SAFETY: a live stream, used by nothing once its last owner is gone.
        unsafe { (self.rt.stream_destroy)(self.stream) };
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
        let _ = self.owner.on_device();
        // SAFETY: a live event; destroying one with work pending is allowed (the
        // runtime releases it once that work completes).
        unsafe { (self.owner.rt.event_destroy)(self.event) };
    }
}

impl CudaEvent {
    /// Records the event after the work queued so far on the copy stream.
    pub fn record_on_copy_stream(&self) -> Result<(), CopyStreamError> {
        let o = &self.owner;
        o.on_device()?;
        // SAFETY: live event and stream.
        check("cudaEventRecord", unsafe {
            (o.rt.event_record)(self.event, o.stream)
        })
    }

    /// Records the event after the work queued so far on PyTorch's compute stream.
    pub fn record_on_compute_stream(&self) -> Result<(), CopyStreamError> {
        let o = &self.owner;
        o.on_device()?;
        // SAFETY: live event; the legacy stream always exists.
        check("cudaEventRecord", unsafe {
            (o.rt.event_record)(self.event, LEGACY_STREAM)
        })
    }

    /// Makes PyTorch's compute stream wait (on the device) for this event.
    pub fn compute_stream_waits(&self) -> Result<(), CopyStreamError> {
        let o = &self.owner;
        o.on_device()?;
        // SAFETY: live event; the legacy stream always exists.
        check("cudaStreamWaitEvent", unsafe {
            (o.rt.stream_wait_event)(LEGACY_STREAM, self.event, 0)
        })
    }

    /// Makes the copy stream wait (on the device) for this event.
    pub fn copy_stream_waits(&self) -> Result<(), CopyStreamError> {
        let o = &self.owner;
        o.on_device()?;
        // SAFETY: live event and stream.
        check("cudaStreamWaitEvent", unsafe {
            (o.rt.stream_wait_event)(o.stream, self.event, 0)
        })
    }

    /// Waits on the host for the event (immediately if it was never recorded).
    pub fn synchronize(&self) -> Result<(), CopyStreamError> {
        let o = &self.owner;
        o.on_device()?;
        // SAFETY: live event.
        check("cudaEventSynchronize", unsafe {
            (o.rt.event_synchronize)(self.event)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_gpu_the_stream_is_a_clear_error() {
        if tch::Cuda::is_available() {
            eprintln!("skipped: CUDA is available (see prefetch's copy-stream test)");
            return;
        }
        // libtorch_cuda (and so the CUDA runtime) is linked even on CPU-only hosts:
        // the runtime's own "no device" error comes back, not a panic.
        let err = CopyStream::new(0).unwrap_err();
        eprintln!("without a GPU: {err}");
        assert!(
            matches!(
                err,
                CopyStreamError::Cuda { .. } | CopyStreamError::NoRuntime
            ),
            "{err}"
        );
    }
}
