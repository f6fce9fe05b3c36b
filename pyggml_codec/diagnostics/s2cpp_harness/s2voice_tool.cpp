// Voice files written and read by the C++ engine itself: s2.cpp's VoiceProfile::save and
// VoiceProfile::load (src/s2_voice.cpp of the tree this is built against), so that the
// .s2voice files of pyggml_codec are checked against the engine's own writer and reader.
//
//   s2voice_tool write SPEC OUT   build a VoiceProfile from SPEC and VoiceProfile::save it to OUT
//   s2voice_tool read IN          VoiceProfile::load IN and print it as one line of JSON:
//       {"num_codebooks":K,"T_prompt":T,"sample_rate":R,"codebook_size":C,
//        "transcript_hex":"...","codes":[...]}
//
// SPEC is text, whitespace-separated: num_codebooks T_prompt sample_rate codebook_size
// transcript_hex code... (transcript_hex: the transcript's bytes in hex, "-" when empty; then
// exactly num_codebooks * T_prompt int32 codes, codebook-major). Exit status 1 with a message
// on stderr for a bad SPEC, a failed save, or a file VoiceProfile::load rejects.
//
// s2_voice.cpp needs only include/s2_voice.h and third_party/filesystem.hpp, so no ggml:
//   c++ -std=c++17 -O2 -I<s2.cpp>/include s2voice_tool.cpp <s2.cpp>/src/s2_voice.cpp -o s2voice_tool

#include "s2_voice.h"

#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <string>

static int fail(const std::string & message) {
    std::fprintf(stderr, "s2voice_tool: %s\n", message.c_str());
    return 1;
}

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static bool from_hex(const std::string & hex, std::string & out) {
    if (hex.size() % 2 != 0) return false;
    out.clear();
    for (size_t i = 0; i < hex.size(); i += 2) {
        const int hi = hex_digit(hex[i]), lo = hex_digit(hex[i + 1]);
        if (hi < 0 || lo < 0) return false;
        out.push_back(static_cast<char>(hi * 16 + lo));
    }
    return true;
}

static int write_profile(const char * spec_path, const char * out_path) {
    std::ifstream spec(spec_path);
    if (!spec) return fail(std::string("cannot open spec ") + spec_path);
    s2::VoiceProfile profile;
    std::string hex;
    if (!(spec >> profile.num_codebooks >> profile.T_prompt >> profile.sample_rate >> profile.codebook_size >> hex)) {
        return fail("spec: expected num_codebooks T_prompt sample_rate codebook_size transcript_hex");
    }
    if (profile.num_codebooks < 0 || profile.T_prompt < 0) return fail("spec: negative num_codebooks or T_prompt");
    if (hex != "-" && !from_hex(hex, profile.transcript)) return fail("spec: transcript_hex is not hex");
    const size_t n = static_cast<size_t>(profile.num_codebooks) * static_cast<size_t>(profile.T_prompt);
    profile.codes.resize(n);
    for (size_t i = 0; i < n; ++i) {
        if (!(spec >> profile.codes[i])) return fail("spec: fewer than num_codebooks * T_prompt int32 codes");
    }
    std::string extra;
    if (spec >> extra) return fail("spec: more than num_codebooks * T_prompt codes");
    if (!profile.save(out_path)) return fail(std::string("VoiceProfile::save failed for ") + out_path);
    return 0;
}

static int read_profile(const char * path) {
    s2::VoiceProfile profile;
    try {
        profile = s2::VoiceProfile::load(path);
    } catch (const std::exception & e) {
        return fail(std::string("VoiceProfile::load: ") + e.what());
    }
    std::printf("{\"num_codebooks\":%d,\"T_prompt\":%d,\"sample_rate\":%d,\"codebook_size\":%d,\"transcript_hex\":\"",
                profile.num_codebooks, profile.T_prompt, profile.sample_rate, profile.codebook_size);
    for (unsigned char c : profile.transcript) std::printf("%02x", c);
    std::printf("\",\"codes\":[");
    for (size_t i = 0; i < profile.codes.size(); ++i) std::printf(i ? ",%d" : "%d", profile.codes[i]);
    std::printf("]}\n");
    return 0;
}

int main(int argc, char ** argv) {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "write" && argc == 4) return write_profile(argv[2], argv[3]);
    if (mode == "read" && argc == 3) return read_profile(argv[2]);
    return fail("usage: s2voice_tool write SPEC OUT | s2voice_tool read IN");
}
