//! Streams across threads: a graph built on one thread's own stream cannot be
//! evaluated on another thread; on a stream made for any thread it can.

use mlx_rs_safe::{ops, with_stream, Array, Device, Stream};

/// `a * 2 + 1` over [1, 2, 3], built lazily on this thread's current stream.
fn lazy_graph() -> Array {
    let a = Array::from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
    let two = Array::from_slice(&[2.0f32], &[1]).unwrap();
    let one = Array::from_slice(&[1.0f32], &[1]).unwrap();
    ops::add(&ops::multiply(&a, &two).unwrap(), &one).unwrap()
}

#[test]
fn a_graph_on_a_threads_own_stream_fails_on_another_thread_with_mlxs_message() {
    let own = Stream::default_for(Device::default_device().unwrap()).unwrap();
    let graph = with_stream(&own, lazy_graph);
    let err = std::thread::spawn(move || graph.to_vec::<f32>().unwrap_err()).join().unwrap();
    assert!(err.to_string().contains("in current thread"), "{err}");
}

#[test]
fn a_graph_built_on_an_any_thread_stream_evaluates_on_another_thread() {
    let shared = Stream::new_any_thread(Device::default_device().unwrap());
    let graph = with_stream(&shared, lazy_graph);
    let launcher = shared.clone();
    let values = std::thread::spawn(move || {
        with_stream(&launcher, || {
            mlx_rs_safe::async_eval(&[&graph]).unwrap();
            let v = graph.to_vec::<f32>().unwrap();
            mlx_rs_safe::synchronize().unwrap();
            v
        })
    })
    .join()
    .unwrap();
    assert_eq!(values, vec![3.0, 5.0, 7.0]);
    // The building thread goes on using the stream after the other is done.
    assert_eq!(with_stream(&shared, || lazy_graph().to_vec::<f32>().unwrap()), vec![3.0, 5.0, 7.0]);
}
