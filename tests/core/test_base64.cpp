// ds/core/base64.h against RFC 4648's test vectors (section 10), the URL-safe alphabet of
// section 5, optional padding, and the errors.
#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "ds/core/base64.h"
#include "ds/core/error.h"

TEST(Base64, Rfc4648Vectors) {
  const std::pair<const char*, const char*> vectors[] = {
      {"", ""},         {"f", "Zg=="},         {"fo", "Zm8="},        {"foo", "Zm9v"},
      {"foob", "Zm9vYg=="}, {"fooba", "Zm9vYmE="}, {"foobar", "Zm9vYmFy"}};
  for (const auto& [plain, coded] : vectors) {
    EXPECT_EQ(ds::base64_urlsafe_encode(plain), coded) << plain;
    EXPECT_EQ(ds::base64_decode(coded), plain) << coded;
    std::string unpadded = coded;
    while (!unpadded.empty() && unpadded.back() == '=') unpadded.pop_back();
    EXPECT_EQ(ds::base64_decode(unpadded), plain) << unpadded;
  }
}

TEST(Base64, BothAlphabets) {
  // 0xfb 0xff 0xbf: the values 62 and 63, '-' '_' in section 5, '+' '/' in section 4.
  const std::string bytes("\xfb\xff\xbf", 3);
  EXPECT_EQ(ds::base64_urlsafe_encode(bytes), "-_-_");
  EXPECT_EQ(ds::base64_decode("-_-_"), bytes);
  EXPECT_EQ(ds::base64_decode("+/+/"), bytes);
  EXPECT_EQ(ds::base64_urlsafe_encode("\xfb\xff"), "-_8=");
  std::string all;
  for (int c = 0; c < 256; ++c) all += static_cast<char>(c);
  EXPECT_EQ(ds::base64_decode(ds::base64_urlsafe_encode(all)), all);
}

TEST(Base64, Errors) {
  EXPECT_THROW(ds::base64_decode("a!b="), ds::Error);
  try {
    ds::base64_decode("Zm9v!A");
    ADD_FAILURE() << "no error";
  } catch (const ds::Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad base64 character '!'"), std::string::npos) << e.what();
  }
  try {
    ds::base64_decode("Zm9vY");
    ADD_FAILURE() << "no error";
  } catch (const ds::Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad base64 length"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(ds::try_base64_decode("Zm9vY").has_value());
  EXPECT_FALSE(ds::try_base64_decode("Zm 9v").has_value());
  EXPECT_EQ(ds::try_base64_decode("Zm9vYg==").value_or("?"), "foob");
}
