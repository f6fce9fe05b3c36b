// s2cpp_dump: run the C++ engine s2.cpp's codec on one input and dump every stage.
//
//   s2cpp_dump info
//   s2cpp_dump decode MODEL.gguf CODES.npy OUT_DIR [THREADS]
//   s2cpp_dump encode MODEL.gguf AUDIO.npy OUT_DIR [THREADS]
//   s2cpp_dump time decode|encode MODEL.gguf INPUT.npy THREADS REPEATS
//
// s2.cpp's codec source is included whole (S2CPP_CODEC_SOURCE, set by CMakeLists.txt), so the
// stages are built by s2.cpp's own graph builders (build_transformer, build_decoder_block, ...).
// This file only composes them the way AudioCodec::decode / AudioCodec::encode do on the CPU
// backend, keeping each stage boundary as a graph output, and then checks itself: the audio (or
// the codes) it composed must equal, bit for bit, what s2.cpp's own AudioCodec::decode (encode)
// returns for the same input. OUT_DIR receives one .npy per stage (numpy shape = ggml ne
// reversed, so channels-last stages are (T, C)) and stages.json (order, ggml build features,
// threads, self-check). Exit status: 0 done, 2 bad usage or input, 3 s2.cpp failed, 4 the
// self-check failed.
#include S2CPP_CODEC_SOURCE

#include "ggml-cpu.h"

#include <chrono>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <sstream>
#include <utility>

namespace {

using s2::AudioCodec;

struct Array {
    std::string descr;             // "<f4" or "<i4"
    std::vector<int64_t> shape;
    std::vector<char> data;
};

[[noreturn]] void fail(int status, const std::string & msg) {
    std::fprintf(stderr, "s2cpp_dump: %s\n", msg.c_str());
    std::exit(status);
}

Array read_npy(const std::string & path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) fail(2, "cannot open " + path);
    char magic[8];
    if (!f.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0) fail(2, path + ": not a .npy file");
    uint32_t hlen = 0;
    if (magic[6] == 1) {
        uint16_t h16 = 0;
        f.read(reinterpret_cast<char *>(&h16), 2);
        hlen = h16;
    } else {
        f.read(reinterpret_cast<char *>(&hlen), 4);
    }
    std::string header(hlen, ' ');
    if (!f.read(&header[0], hlen)) fail(2, path + ": truncated header");
    Array a;
    const auto d = header.find("'descr': '");
    if (d == std::string::npos) fail(2, path + ": no descr");
    a.descr = header.substr(d + 10, 3);
    if (header.find("'fortran_order': False") == std::string::npos) fail(2, path + ": must be C order");
    const auto s = header.find("'shape': (");
    if (s == std::string::npos) fail(2, path + ": no shape");
    std::stringstream ss(header.substr(s + 10, header.find(')', s) - s - 10));
    std::string item;
    size_t n = 1;
    while (std::getline(ss, item, ',')) {
        if (item.find_first_not_of(' ') == std::string::npos) continue;
        a.shape.push_back(std::stoll(item));
        n *= static_cast<size_t>(a.shape.back());
    }
    if (a.descr != "<f4" && a.descr != "<i4") fail(2, path + ": dtype must be float32 or int32, got " + a.descr);
    a.data.resize(n * 4);
    if (!f.read(a.data.data(), static_cast<std::streamsize>(a.data.size()))) fail(2, path + ": truncated data");
    return a;
}

void write_npy(const std::string & path, const void * data, const char * descr, const std::vector<int64_t> & shape) {
    std::string dims;
    size_t n = 1;
    for (int64_t v : shape) { dims += std::to_string(v) + ", "; n *= static_cast<size_t>(v); }
    if (shape.size() > 1) dims.resize(dims.size() - 2);
    std::string header = "{'descr': '" + std::string(descr) + "', 'fortran_order': False, 'shape': (" + dims + "), }";
    while ((10 + header.size() + 1) % 64) header += ' ';
    header += '\n';
    std::ofstream f(path, std::ios::binary);
    const uint16_t hlen = static_cast<uint16_t>(header.size());
    f.write("\x93NUMPY\x01\x00", 8);
    f.write(reinterpret_cast<const char *>(&hlen), 2);
    f << header;
    f.write(static_cast<const char *>(data), static_cast<std::streamsize>(n * 4));
    if (!f) fail(2, "cannot write " + path);
}

// Whether ggml's F16 dot product adds in half precision (a ggml-cpu built for AVX512-FP16: 32
// half lanes) rather than in single precision; ggml reports no such feature, so it is measured,
// with the probe of pyggml_codec's binding.f16_dot_sums_in_half: [2048, 1, 0, ...] . [1, ...]
// over 128 elements is 2048 in half precision (2049 rounds to even), 2049 in single.
int f16_dot_half() {
    ggml_cpu_init();  // the leftover loop reads ggml's F16 table, filled here
    const int n = 128;
    std::vector<ggml_fp16_t> x(n, ggml_fp32_to_fp16(0.0f)), y(n, ggml_fp32_to_fp16(1.0f));
    x[0] = ggml_fp32_to_fp16(2048.0f);
    x[1] = ggml_fp32_to_fp16(1.0f);
    float s = 0.0f;
    ggml_get_type_traits_cpu(GGML_TYPE_F16)->vec_dot(n, &s, 0, x.data(), 0, y.data(), 0, 1);
    if (s != 2048.0f && s != 2049.0f) fail(3, "ggml's F16 dot product gave " + std::to_string(s) + " on its probe");
    return s == 2048.0f;
}

std::string features_json() {
    std::ostringstream o;
    o << "{\"avx\": " << ggml_cpu_has_avx() << ", \"avx2\": " << ggml_cpu_has_avx2()
      << ", \"avx512\": " << ggml_cpu_has_avx512() << ", \"f16c\": " << ggml_cpu_has_f16c()
      << ", \"fma\": " << ggml_cpu_has_fma() << ", \"llamafile\": " << ggml_cpu_has_llamafile()
      << ", \"f16_dot_half\": " << f16_dot_half()
      << ", \"ggml_commit\": \"" << ggml_commit() << "\"}";
    return o.str();
}

// One stage-marked graph: stage tensors stay graph outputs (the allocator keeps their memory)
// and are read after the compute.
struct StagedGraph {
    std::vector<uint8_t> buf;
    ggml_context * ctx = nullptr;
    std::vector<std::pair<std::string, ggml_tensor *>> stages;

    explicit StagedGraph(size_t bytes) : buf(bytes) {
        ggml_init_params p = { bytes, buf.data(), true };
        ctx = ggml_init(p);
        if (!ctx) fail(3, "ggml_init failed");
    }
    ~StagedGraph() { if (ctx) ggml_free(ctx); }

    // A view (a reshape, a cpy's result) is kept through a copy: the allocator keeps an output's
    // own memory, not the memory of the tensor a view looks into. Copies are exact.
    ggml_tensor * mark(const std::string & name, ggml_tensor * t) {
        ggml_tensor * kept = t->view_src != nullptr || !ggml_is_contiguous(t) ? ggml_cont(ctx, t) : t;
        ggml_set_output(kept);
        stages.emplace_back(name, kept);
        return t;
    }

    // The graph's output: an F32 copy of x (as s2.cpp's ggml_cpy), kept as stage `name`.
    ggml_tensor * output(const std::string & name, ggml_tensor * x) {
        ggml_tensor * out = ggml_cpy(ctx, x, ggml_new_tensor_2d(ctx, GGML_TYPE_F32, x->ne[0], x->ne[1]));
        mark(name, out);
        return out;
    }

    // Allocate and compute as s2.cpp does (gallocr on the backend's buffer type, one compute),
    // then hand every stage to `take` as F32 values with its ggml ne.
    void run(AudioCodec::Impl & impl, ggml_tensor * out, int threads, const std::function<void()> & set_inputs,
             const std::function<void(const std::string &, const std::vector<float> &, ggml_tensor *)> & take) {
        ggml_cgraph * gf = ggml_new_graph_custom(ctx, 131072, false);
        for (auto & st : stages) ggml_build_forward_expand(gf, st.second);
        ggml_build_forward_expand(gf, out);
        ggml_gallocr_t allocr = ggml_gallocr_new(ggml_backend_get_default_buffer_type(impl.backend));
        if (!allocr || !ggml_gallocr_alloc_graph(allocr, gf)) fail(3, "graph allocation failed");
        set_inputs();
        ggml_backend_cpu_set_n_threads(impl.backend, threads);
        if (ggml_backend_graph_compute(impl.backend, gf) != GGML_STATUS_SUCCESS) fail(3, "graph compute failed");
        for (auto & st : stages) take(st.first, s2::tensor_to_f32(st.second), st.second);
        ggml_gallocr_free(allocr);
    }
};

struct Dump {
    std::string dir;
    std::vector<std::string> order;

    void put(const std::string & name, const std::vector<float> & v, ggml_tensor * t) {
        std::vector<int64_t> shape;
        for (int i = GGML_MAX_DIMS - 1; i >= 0; --i) if (t->ne[i] > 1 || !shape.empty()) shape.push_back(t->ne[i]);
        if (shape.empty()) shape.push_back(1);
        while (shape.size() > 2 && shape.front() == 1) shape.erase(shape.begin());
        write_npy(dir + "/" + name + ".npy", v.data(), "<f4", shape);
        order.push_back(name);
    }
    void put_raw(const std::string & name, const void * data, const char * descr, const std::vector<int64_t> & shape) {
        write_npy(dir + "/" + name + ".npy", data, descr, shape);
        order.push_back(name);
    }
    void finish(const std::string & kind, int threads, bool self_check) {
        std::ofstream f(dir + "/stages.json");
        f << "{\"kind\": \"" << kind << "\", \"threads\": " << threads << ", \"self_check\": "
          << (self_check ? "true" : "false") << ", \"ggml\": " << features_json() << ", \"stages\": [";
        for (size_t i = 0; i < order.size(); ++i) f << (i ? ", " : "") << "\"" << order[i] << "\"";
        f << "]}\n";
        if (!f) fail(2, "cannot write " + dir + "/stages.json");
    }
};

void set_transformer_inputs(s2::transformer_inputs & inp) {
    if (inp.positions)
        ggml_backend_tensor_set(inp.positions, inp.position_values.data(), 0, inp.position_values.size() * sizeof(int32_t));
    if (inp.mask)
        ggml_backend_tensor_set(inp.mask, inp.mask_values.data(), 0, inp.mask_values.size() * sizeof(float));
}

ggml_tensor * req(AudioCodec::Impl & impl, const std::string & name) {
    ggml_tensor * t = ggml_get_tensor(impl.ctx_w, (impl.tprefix + name).c_str());
    if (!t) fail(3, "missing tensor " + impl.tprefix + name);
    return t;
}

// The RVQ transformer (post_module in decode, pre_module in encode) with s2.cpp's arguments.
ggml_tensor * rvq_transformer(ggml_context * ctx, AudioCodec::Impl & impl, const char * name, ggml_tensor * x,
                              s2::transformer_inputs & inp) {
    return s2::build_transformer(ctx, impl.ctx_w, impl.tprefix + "quantizer." + name, x,
        impl.rvq_transformer_block_size, impl.rvq_transformer_n_local_heads, impl.rvq_transformer_head_dim,
        impl.rvq_transformer_rope_base, impl.rvq_transformer_norm_eps, impl.rvq_transformer_window_size,
        s2::backend_requires_explicit_causal_mask(impl.backend), inp);
}

bool same_bits(const std::vector<float> & a, const std::vector<float> & b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// AudioCodec::decode on the CPU backend: graph 1 codes -> VQ sum -> post_module -> upsample,
// graph 2 decoder -> tanh.
int run_decode(AudioCodec & codec, const Array & codes, Dump & dump, int threads) {
    AudioCodec::Impl & impl = *codec.impl_;
    const int32_t n_cb = impl.quantizer_residual_codebooks + 1;
    if (codes.descr != "<i4" || codes.shape.size() != 2 || codes.shape[0] != n_cb || codes.shape[1] < 1)
        fail(2, "codes must be int32 of shape (" + std::to_string(n_cb) + ", T)");
    const int32_t n_frames = static_cast<int32_t>(codes.shape[1]);
    const int32_t * raw = reinterpret_cast<const int32_t *>(codes.data.data());
    dump.put_raw("codes", raw, "<i4", {n_cb, n_frames});

    std::vector<int32_t> clamped(raw, raw + static_cast<size_t>(n_cb) * n_frames);
    for (int32_t cb = 0; cb < n_cb; ++cb) {
        const int32_t size = cb == 0 ? impl.quantizer_semantic_codebook_size : impl.quantizer_residual_codebook_size;
        for (int32_t t = 0; t < n_frames; ++t) {
            int32_t & c = clamped[static_cast<size_t>(cb) * n_frames + t];
            c = c < 0 ? 0 : (c >= size ? size - 1 : c);
        }
    }

    std::vector<float> latent;
    int64_t latent_dim = 0, latent_frames = 0;
    {
        StagedGraph g(96u * 1024u * 1024u);
        s2::transformer_inputs inp;
        std::vector<ggml_tensor *> ids(n_cb);
        for (auto & t : ids) t = ggml_new_tensor_1d(g.ctx, GGML_TYPE_I32, n_frames);
        ggml_tensor * x = g.mark("dec.vq_sum", s2::build_decode_codes_stage_backend(g.ctx, impl, ids));
        x = g.mark("dec.post_module", rvq_transformer(g.ctx, impl, "post_module", x, inp));
        const size_t n = impl.quantizer_downsample_factor.size();
        for (size_t i = 0; i < n; ++i) {
            x = s2::build_quantizer_stage_up(g.ctx, impl, impl.tprefix + "quantizer.upsample." + std::to_string(i), x,
                                             impl.quantizer_downsample_factor[n - 1 - i]);
            x = g.mark("dec.upsample" + std::to_string(i), x);
        }
        ggml_tensor * out = g.output("dec.latent", x);
        g.run(impl, out, threads, [&] {
            for (int32_t cb = 0; cb < n_cb; ++cb)
                ggml_backend_tensor_set(ids[cb], clamped.data() + static_cast<size_t>(cb) * n_frames, 0, n_frames * sizeof(int32_t));
            set_transformer_inputs(inp);
        }, [&](const std::string & name, const std::vector<float> & v, ggml_tensor * t) {
            dump.put(name, v, t);
            if (name == "dec.latent") { latent = v; latent_dim = t->ne[0]; latent_frames = t->ne[1]; }
        });
    }

    std::vector<float> audio;
    {
        StagedGraph g(128u * 1024u * 1024u);
        ggml_tensor * latent_in = ggml_new_tensor_2d(g.ctx, GGML_TYPE_F32, latent_dim, latent_frames);
        ggml_tensor * x = s2::causal_conv_1d(g.ctx, req(impl, "decoder.model.0.conv.weight"),
                                             req(impl, "decoder.model.0.conv.bias"), latent_in, 1, 1);
        for (size_t i = 0; i < impl.decoder_rates.size(); ++i) {
            x = s2::build_decoder_block(g.ctx, impl, impl.tprefix + "decoder.model." + std::to_string(i + 1), x,
                                        impl.decoder_rates[i]);
            x = g.mark("dec.block" + std::to_string(i + 1), x);
        }
        const int last = static_cast<int>(impl.decoder_rates.size()) + 1;
        x = s2::snake_activation(g.ctx, x, req(impl, "decoder.model." + std::to_string(last) + ".alpha"));
        x = s2::causal_conv_1d(g.ctx, req(impl, "decoder.model." + std::to_string(last + 1) + ".conv.weight"),
                               req(impl, "decoder.model." + std::to_string(last + 1) + ".conv.bias"), x, 1, 1);
        x = g.mark("dec.pre_tanh", x);
        ggml_tensor * out = g.output("audio", ggml_tanh(g.ctx, x));
        g.run(impl, out, threads, [&] {
            ggml_backend_tensor_set(latent_in, latent.data(), 0, latent.size() * sizeof(float));
        }, [&](const std::string & name, const std::vector<float> & v, ggml_tensor * t) {
            if (name == "audio") { audio = v; dump.put_raw("audio", v.data(), "<f4", {static_cast<int64_t>(v.size())}); }
            else dump.put(name, v, t);
        });
    }

    std::vector<float> reference;
    if (!codec.decode(raw, n_frames, threads, reference)) fail(3, "AudioCodec::decode failed");
    const bool ok = same_bits(audio, reference);
    dump.finish("decode", threads, ok);
    if (!ok) fail(4, "self-check: the composed decode differs from AudioCodec::decode (this harness does not "
                     "match this s2.cpp version's decode)");
    return 0;
}

// AudioCodec::encode: pad to frame_length, graph 1 wave -> latent, graph 2 downsample ->
// pre_module, then the host VQ (quantize_with_vq) stage by stage.
int run_encode(AudioCodec & codec, const Array & audio_in, Dump & dump, int threads) {
    AudioCodec::Impl & impl = *codec.impl_;
    if (audio_in.descr != "<f4" || audio_in.shape.size() != 1 || audio_in.shape[0] < 1)
        fail(2, "audio must be float32 of shape (n,)");
    const int32_t n_samples = static_cast<int32_t>(audio_in.shape[0]);
    const float * samples = reinterpret_cast<const float *>(audio_in.data.data());
    const int32_t frame_length = impl.frame_length > 0 ? impl.frame_length : 512;
    const int32_t padded = ((n_samples + frame_length - 1) / frame_length) * frame_length;
    std::vector<float> wave(padded, 0.0f);
    std::copy(samples, samples + n_samples, wave.begin());
    dump.put_raw("audio", samples, "<f4", {n_samples});  // the signal before padding, as the Python dumps

    std::vector<float> latent;
    int64_t latent_frames = 0;
    {
        StagedGraph g(128u * 1024u * 1024u);
        s2::transformer_inputs inp;
        ggml_tensor * in = ggml_new_tensor_2d(g.ctx, GGML_TYPE_F32, 1, padded);
        ggml_tensor * x = s2::causal_conv_1d(g.ctx, req(impl, "encoder.block.0.conv.weight"),
                                             req(impl, "encoder.block.0.conv.bias"), in, 1, 1);
        for (size_t i = 0; i < impl.encoder_rates.size(); ++i) {
            const int32_t n_layers = i < impl.encoder_transformer_layers.size() ? impl.encoder_transformer_layers[i] : 0;
            x = s2::build_encoder_block(g.ctx, impl, impl.tprefix + "encoder.block." + std::to_string(i + 1) + ".block",
                                        x, impl.encoder_rates[i], n_layers, inp);
            x = g.mark("enc.block" + std::to_string(i + 1), x);
        }
        const int last = static_cast<int>(impl.encoder_rates.size()) + 1;
        x = s2::snake_activation(g.ctx, x, req(impl, "encoder.block." + std::to_string(last) + ".alpha"));
        x = s2::causal_conv_1d(g.ctx, req(impl, "encoder.block." + std::to_string(last + 1) + ".conv.weight"),
                               req(impl, "encoder.block." + std::to_string(last + 1) + ".conv.bias"), x, 1, 1);
        ggml_tensor * out = g.output("latent", x);
        g.run(impl, out, threads, [&] {
            ggml_backend_tensor_set(in, wave.data(), 0, wave.size() * sizeof(float));
            set_transformer_inputs(inp);
        }, [&](const std::string & name, const std::vector<float> & v, ggml_tensor * t) {
            dump.put(name, v, t);
            if (name == "latent") { latent = v; latent_frames = t->ne[1]; }
        });
    }

    std::vector<float> stage;
    int64_t stage_frames = 0;
    {
        StagedGraph g(96u * 1024u * 1024u);
        s2::transformer_inputs inp;
        ggml_tensor * in = ggml_new_tensor_2d(g.ctx, GGML_TYPE_F32, impl.latent_dim, latent_frames);
        ggml_tensor * x = in;
        for (size_t i = 0; i < impl.quantizer_downsample_factor.size(); ++i) {
            const std::string p = impl.tprefix + "quantizer.downsample." + std::to_string(i);
            x = s2::causal_conv_1d(g.ctx, req(impl, "quantizer.downsample." + std::to_string(i) + ".0.conv.weight"),
                                   req(impl, "quantizer.downsample." + std::to_string(i) + ".0.conv.bias"), x,
                                   impl.quantizer_downsample_factor[i], 1);
            x = s2::build_convnext_block(g.ctx, impl.ctx_w, p + ".1", x);
            x = g.mark("enc.downsample" + std::to_string(i), x);
        }
        ggml_tensor * out = g.output("pre_module", rvq_transformer(g.ctx, impl, "pre_module", x, inp));
        g.run(impl, out, threads, [&] {
            ggml_backend_tensor_set(in, latent.data(), 0, latent.size() * sizeof(float));
            set_transformer_inputs(inp);
        }, [&](const std::string & name, const std::vector<float> & v, ggml_tensor * t) {
            dump.put(name, v, t);
            if (name == "pre_module") { stage = v; stage_frames = t->ne[1]; }
        });
    }

    const int32_t frames = static_cast<int32_t>(stage_frames);
    const int32_t n_cb = impl.quantizer_residual_codebooks + 1;
    const int64_t dim = impl.quantizer_input_dim;
    std::vector<int32_t> codes(static_cast<size_t>(n_cb) * frames);
    std::vector<float> residual = stage;
    for (int32_t i = 0; i < n_cb; ++i) {
        const s2::vq_cache & vq = i == 0 ? impl.semantic_vq : impl.residual_vq[static_cast<size_t>(i - 1)];
        dump.put_raw("enc.vq" + std::to_string(i) + ".residual", residual.data(), "<f4", {frames, dim});
        std::vector<int32_t> c;
        std::vector<float> proj;
        s2::quantize_with_vq(vq, residual, frames, c, proj);
        for (size_t j = 0; j < residual.size(); ++j) residual[j] -= proj[j];
        dump.put_raw("enc.vq" + std::to_string(i) + ".codes", c.data(), "<i4", {frames});
        std::copy(c.begin(), c.end(), codes.begin() + static_cast<ptrdiff_t>(i) * frames);
    }
    dump.put_raw("codes", codes.data(), "<i4", {n_cb, frames});

    std::vector<int32_t> reference;
    int32_t ref_frames = 0;
    if (!codec.encode(samples, n_samples, threads, reference, ref_frames)) fail(3, "AudioCodec::encode failed");
    const bool ok = ref_frames == frames && reference == codes;
    dump.finish("encode", threads, ok);
    if (!ok) fail(4, "self-check: the composed encode differs from AudioCodec::encode (this harness does not "
                     "match this s2.cpp version's encode)");
    return 0;
}

}  // namespace

// s2cpp_dump time decode|encode MODEL INPUT.npy THREADS REPEATS: AudioCodec::decode (encode)
// run once to warm up, then REPEATS times; prints JSON with the wall and process CPU seconds
// of each timed call (for benchmarks side by side with the Python codec).
int run_time(int argc, char ** argv) {
    if (argc != 7) fail(2, "usage: s2cpp_dump time decode|encode MODEL.gguf INPUT.npy THREADS REPEATS");
    const std::string kind = argv[2];
    const int threads = std::atoi(argv[5]), repeats = std::atoi(argv[6]);
    if ((kind != "decode" && kind != "encode") || threads < 1 || repeats < 1) fail(2, "bad time arguments");
    const Array input = read_npy(argv[4]);
    AudioCodec codec;
    if (!codec.load(argv[3], -1, s2::BackendType::CPU)) fail(3, std::string("s2.cpp could not load ") + argv[3]);
    auto once = [&] {
        if (kind == "decode") {
            if (input.descr != "<i4" || input.shape.size() != 2) fail(2, "codes must be int32 (K, T)");
            std::vector<float> audio;
            if (!codec.decode(reinterpret_cast<const int32_t *>(input.data.data()), static_cast<int32_t>(input.shape[1]),
                              threads, audio)) fail(3, "AudioCodec::decode failed");
        } else {
            if (input.descr != "<f4" || input.shape.size() != 1) fail(2, "audio must be float32 (n,)");
            std::vector<int32_t> codes;
            int32_t frames = 0;
            if (!codec.encode(reinterpret_cast<const float *>(input.data.data()), static_cast<int32_t>(input.shape[0]),
                              threads, codes, frames)) fail(3, "AudioCodec::encode failed");
        }
    };
    once();
    std::printf("{\"wall_s\": [");
    std::string cpu = "";
    for (int i = 0; i < repeats; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        const std::clock_t c0 = std::clock();
        once();
        const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const double used = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
        std::printf("%s%.6f", i ? ", " : "", wall);
        cpu += (i ? ", " : "") + std::to_string(used);
    }
    std::printf("], \"cpu_s\": [%s], \"threads\": %d, \"ggml\": %s}\n", cpu.c_str(), threads, features_json().c_str());
    return 0;
}

int main(int argc, char ** argv) {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "info") {
        std::printf("%s\n", features_json().c_str());
        return 0;
    }
    if (mode == "time") return run_time(argc, argv);
    if ((mode != "decode" && mode != "encode") || argc < 5 || argc > 6)
        fail(2, "usage: s2cpp_dump info | decode MODEL.gguf CODES.npy OUT_DIR [THREADS] | "
                "encode MODEL.gguf AUDIO.npy OUT_DIR [THREADS]");
    const int threads = argc == 6 ? std::atoi(argv[5]) : 1;
    if (threads < 1) fail(2, "THREADS must be a positive integer");
    const Array input = read_npy(argv[3]);
    AudioCodec codec;
    if (!codec.load(argv[2], -1, s2::BackendType::CPU)) fail(3, std::string("s2.cpp could not load ") + argv[2]);
    Dump dump{argv[4], {}};
    return mode == "decode" ? run_decode(codec, input, dump, threads) : run_encode(codec, input, dump, threads);
}
